package llmsim

import (
	"encoding/json"
	"sort"
	"strings"
	"unicode"

	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// output is the text of an answer, token by token. Token pos depends only
// on the request and pos, so a preempted sequence that is recomputed
// continues with exactly the tokens it would have produced.
type output interface {
	token(pos int) string
}

// prose is an answer in words; the word at period, if any, ends it with a
// full stop.
type prose struct {
	ans    answer
	period int
}

func (p prose) token(pos int) string { return p.ans.token(pos, pos == p.period) }

// tokenList is an answer worked out whole on arrival: JSON or a tool call.
// Both are short (an answer's natural length), so holding them costs
// little.
type tokenList []string

func (l tokenList) token(pos int) string {
	if pos < len(l) {
		return l[pos]
	}
	return ""
}

// stopped is an answer cut where a stop sequence begins: the tokens before
// token at whole, the first keep bytes of token at, then nothing. The
// model still spends the tokens that write the stop sequence, as a real
// one does before its detokenizer sees the sequence complete.
type stopped struct {
	src  output
	at   int
	keep int
}

func (s stopped) token(pos int) string {
	switch {
	case pos < s.at:
		return s.src.token(pos)
	case pos == s.at:
		return s.src.token(pos)[:s.keep]
	}
	return ""
}

// script is what a request's answer will be. Answers are deterministic, so
// it is known on arrival, and so are the answer's length and how it ends.
type script struct {
	out output
	// target is the number of tokens the answer takes; reason is the
	// engine's finish reason, finishStop or finishLength.
	target int
	reason string
	// call is the tool call the answer makes, its arguments left out:
	// out's tokens write them. Nil for an answer in text.
	call *openai.ToolCall
}

// generation is what a request asks of its answers beyond their length.
type generation struct {
	// seed is the request's seed; nil when it set none or asked for greedy
	// decoding (temperature 0), which no seed changes.
	seed *int64
	// greedy is decoding at temperature 0, which writes the same text in
	// every choice.
	greedy bool
	stop   []string
	// format is openai.FormatText, FormatJSONObject or FormatJSONSchema;
	// schema is json_schema's schema.
	format string
	schema json.RawMessage
	// tool is the function the answer calls; nil for an answer in text.
	tool *openai.FunctionDef
	// answerTokens, if not 0, is the natural length the request asked
	// for with the answer-length directive (control.go).
	answerTokens int
}

// plan writes the scripts of a request's n answers, one per choice, each
// of which may take up to budget tokens.
func (s *Server) plan(msgs []tokens.Message, g generation, budget, n int) []script {
	ans := newAnswer(s.cfg.Seed, msgs)
	if g.seed != nil {
		ans = ans.withSeed(*g.seed)
	}
	scripts := make([]script, n)
	for i := range scripts {
		scripts[i] = s.planAnswer(ans.forChoice(i, g.greedy), g, budget)
	}
	return scripts
}

// planAnswer writes the script of one answer.
func (s *Server) planAnswer(ans answer, g generation, budget int) script {
	if g.tool != nil {
		// Stop sequences end text; a call's arguments ignore them.
		call, toks := toolCall(ans, *g.tool)
		sc := listScript(toks, budget)
		sc.call = &call
		return sc
	}
	natural := ans.naturalLength(s.cfg.AnswerMinTokens, s.cfg.AnswerMaxTokens)
	if g.answerTokens > 0 {
		natural = g.answerTokens
	}
	var sc script
	switch g.format {
	case openai.FormatJSONObject, openai.FormatJSONSchema:
		// A schema validated on arrival reads without error.
		props, _, _ := readSchema(g.schema)
		sc = listScript(jsonAnswer(ans, natural, props), budget)
	default:
		sc = script{out: prose{ans: ans, period: natural - 1}, target: natural, reason: finishStop}
		// An answer cut by the budget has no full stop, even one cut at
		// its natural length.
		if budget <= natural {
			sc = script{out: prose{ans: ans, period: -1}, target: budget, reason: finishLength}
		}
	}
	return sc.stopAt(g.stop)
}

// listScript is the script of an answer worked out whole, cut to budget.
func listScript(toks tokenList, budget int) script {
	if budget < len(toks) {
		return script{out: toks, target: budget, reason: finishLength}
	}
	return script{out: toks, target: len(toks), reason: finishStop}
}

// stopAt ends the answer before the first stop sequence it writes, which
// may span tokens. It then finishes with "stop" when the token that
// completes the sequence is produced; the sequence itself is not sent.
func (sc script) stopAt(stops []string) script {
	if len(stops) == 0 {
		return sc
	}
	var text strings.Builder
	// ends[i] is the offset in text just after token i.
	ends := make([]int, sc.target)
	for i := range sc.target {
		text.WriteString(sc.out.token(i))
		ends[i] = text.Len()
	}
	start, end := firstStop(text.String(), stops)
	if start < 0 {
		return sc
	}
	at := sort.SearchInts(ends, start+1)
	keep := start
	if at > 0 {
		keep -= ends[at-1]
	}
	last := sort.SearchInts(ends, end)
	return script{out: stopped{src: sc.out, at: at, keep: keep}, target: last + 1, reason: finishStop, call: sc.call}
}

// firstStop finds the stop sequence a model writing text token by token
// would complete first: the one that ends earliest, the longer one on a
// tie. It returns where it starts and ends, or -1, -1.
func firstStop(text string, stops []string) (start, end int) {
	start, end = -1, -1
	for _, s := range stops {
		i := strings.Index(text, s)
		if s == "" || i < 0 {
			continue
		}
		if e := i + len(s); end < 0 || e < end || (e == end && i < start) {
			start, end = i, e
		}
	}
	return start, end
}

// finishReason is the answer's finish_reason for the engine's reason: a
// tool call that ends on its own finishes with "tool_calls".
func (sc script) finishReason(engine string) string {
	if sc.call != nil && engine == finishStop {
		return openai.FinishToolCalls
	}
	return engine
}

// opening is the delta of the answer's first chunk: the role, with empty
// content for text, or with the call's id, type and name.
func (sc script) opening() openai.Delta {
	if sc.call == nil {
		empty := ""
		return openai.Delta{Role: openai.RoleAssistant, Content: &empty}
	}
	return openai.Delta{Role: openai.RoleAssistant, ToolCalls: []openai.ToolCallDelta{{
		ID: sc.call.ID, Type: sc.call.Type, Function: openai.FunctionCallDelta{Name: sc.call.Function.Name},
	}}}
}

// piece is the delta that adds text to the answer: content, or a piece of
// the call's arguments.
func (sc script) piece(text string) openai.Delta {
	if sc.call == nil {
		return openai.Delta{Content: &text}
	}
	return openai.Delta{ToolCalls: []openai.ToolCallDelta{{Function: openai.FunctionCallDelta{Arguments: text}}}}
}

// message is the whole answer of a completion that did not stream.
func (sc script) message(text string) openai.AssistantMessage {
	if sc.call == nil {
		return openai.AssistantMessage{Role: openai.RoleAssistant, Content: &text}
	}
	call := *sc.call
	call.Function.Arguments = text
	return openai.AssistantMessage{Role: openai.RoleAssistant, ToolCalls: []openai.ToolCall{call}}
}

// jsonAnswer is an answer in JSON, as response_format json_object or
// json_schema asks: an object with the schema's top-level properties, each
// a value of its type, strings made of the answer's words; with no
// properties, {"answer": "<words>"}. It is written the way a model writes
// JSON, structure and words in separate tokens.
func jsonAnswer(ans answer, words int, props []property) tokenList {
	if len(props) == 0 {
		props = []property{{name: "answer", typ: "string"}}
	}
	strs := 0
	for _, p := range props {
		if p.isString() {
			strs++
		}
	}
	per := max(1, words/max(1, strs))
	var b tokenWriter
	b.lit("{")
	pos := 0
	for i, p := range props {
		if i > 0 {
			b.lit(", ")
		}
		b.lit(quote(p.name) + ": ")
		if !p.isString() {
			b.lit(p.sample(ans, i))
			continue
		}
		b.lit(`"`)
		b.words(ans.phrase(pos, per))
		pos += per
		b.lit(`"`)
	}
	b.lit("}")
	return b.done()
}

// tokenWriter cuts JSON into tokens: literal text in runs of letters or
// digits and runs of the rest, words as they are.
type tokenWriter struct {
	toks    tokenList
	pending strings.Builder
}

func (w *tokenWriter) lit(s string) { w.pending.WriteString(s) }

func (w *tokenWriter) words(ws []string) {
	w.flush()
	for _, word := range ws {
		// Words are letters and digits, but a word that needs escaping
		// must not break the JSON.
		q := quote(word)
		w.toks = append(w.toks, q[1:len(q)-1])
	}
}

func (w *tokenWriter) flush() {
	w.toks = append(w.toks, splitRuns(w.pending.String())...)
	w.pending.Reset()
}

func (w *tokenWriter) done() tokenList {
	w.flush()
	return w.toks
}

// splitRuns cuts s into runs of letters or digits and runs of anything
// else, roughly where a BPE tokenizer cuts JSON.
func splitRuns(s string) []string {
	var out []string
	start, prevWord := 0, false
	for i, r := range s {
		word := unicode.IsLetter(r) || unicode.IsDigit(r)
		if i > start && word != prevWord {
			out = append(out, s[start:i])
			start = i
		}
		prevWord = word
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// quote is s as a JSON string.
func quote(s string) string {
	// Marshalling a string cannot fail.
	b, _ := json.Marshal(s)
	return string(b)
}
