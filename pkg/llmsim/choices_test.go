package llmsim_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/openai"
)

const choicesQuestion = "How does continuous batching share the GPU between requests?"

// streamedChoice is one choice as its chunks build it.
type streamedChoice struct {
	text   string
	calls  []openai.ToolCall
	finish string
}

// streamChoices folds the chunks of a stream into its choices, by index,
// and checks the framing OpenAI and vLLM use for several choices: one
// choice a chunk, the role on each choice's first chunk and no other,
// nothing for a choice after its finish chunk, the usage chunk last.
func streamChoices(t *testing.T, chunks []openai.Chunk) ([]streamedChoice, openai.Usage) {
	t.Helper()
	var out []streamedChoice
	var u openai.Usage
	seen := map[int]bool{}
	callIndex := map[int]map[int]int{}
	for i, c := range chunks {
		if len(c.Choices) == 0 {
			if i != len(chunks)-1 || c.Usage.Value == nil {
				t.Fatalf("chunk %d has no choice and is not the last, usage chunk: %+v", i, c)
			}
			u = *c.Usage.Value
			continue
		}
		if len(c.Choices) != 1 {
			t.Fatalf("chunk %d has %d choices, want one a chunk", i, len(c.Choices))
		}
		ch := c.Choices[0]
		for len(out) <= ch.Index {
			out = append(out, streamedChoice{})
		}
		sc := &out[ch.Index]
		if sc.finish != "" {
			t.Fatalf("chunk %d for choice %d after its finish chunk", i, ch.Index)
		}
		if first := !seen[ch.Index]; first != (ch.Delta.Role == "assistant") {
			t.Fatalf("chunk %d (choice %d, first %v) has role %q, want assistant on the choice's first chunk only",
				i, ch.Index, first, ch.Delta.Role)
		}
		seen[ch.Index] = true
		if ch.Delta.Content != nil {
			sc.text += *ch.Delta.Content
		}
		if callIndex[ch.Index] == nil {
			callIndex[ch.Index] = map[int]int{}
		}
		sc.calls = openai.AddToolCalls(sc.calls, callIndex[ch.Index], ch.Delta.ToolCalls)
		if ch.FinishReason != nil {
			sc.finish = *ch.FinishReason
		}
	}
	for i, sc := range out {
		if sc.finish == "" {
			t.Errorf("choice %d has no finish chunk", i)
		}
	}
	return out, u
}

func choicesRequest(n int) map[string]any {
	return map[string]any{"model": "choices-model", "messages": userMsg(choicesQuestion), "seed": 7, "n": n}
}

// checkChoices checks that a completion has n choices, indexed in order.
func checkChoices(t *testing.T, c openai.Completion, n int) {
	t.Helper()
	if len(c.Choices) != n {
		t.Fatalf("got %d choices, want %d", len(c.Choices), n)
	}
	for i, ch := range c.Choices {
		if ch.Index != i || ch.Message.Role != "assistant" {
			t.Errorf("choice %d has index %d and role %q", i, ch.Index, ch.Message.Role)
		}
	}
}

func choiceText(ch openai.Choice) string {
	if ch.Message.Content == nil {
		return ""
	}
	return *ch.Message.Content
}

func TestChoicesCompletion(t *testing.T) {
	sim := start(t, testConfig())
	c, _ := sim.completionN(t, choicesRequest(3))
	checkChoices(t, c, 3)
	words, texts := 0, map[string]bool{}
	for i, ch := range c.Choices {
		text := choiceText(ch)
		if text == "" || ch.FinishReason != "stop" || !strings.HasSuffix(text, ".") {
			t.Errorf("choice %d = %q (%s), want a whole answer ending with stop", i, text, ch.FinishReason)
		}
		texts[text] = true
		words += len(strings.Fields(text))
	}
	if len(texts) != 3 {
		t.Errorf("choices are not three different answers: %+v", c.Choices)
	}
	// One generated token is one word.
	if u := c.Usage; u.CompletionTokens != words || u.TotalTokens != u.PromptTokens+words || u.PromptTokens < 10 {
		t.Errorf("usage %+v, want the %d words of all choices once the prompt", u, words)
	}
	one, _ := sim.completion(t, choicesRequest(1))
	if text(one) != choiceText(c.Choices[0]) || one.Usage.PromptTokens != c.Usage.PromptTokens {
		t.Errorf("n=1 answers %q, want choice 0 of n=3, %q", text(one), choiceText(c.Choices[0]))
	}
	again, _ := sim.completionN(t, choicesRequest(3))
	for i := range again.Choices {
		if choiceText(again.Choices[i]) != choiceText(c.Choices[i]) {
			t.Errorf("choice %d changed between two requests with the same seed and prompt", i)
		}
	}
}

func TestChoicesStreamed(t *testing.T) {
	sim := start(t, testConfig())
	want, _ := sim.completionN(t, choicesRequest(3))
	chunks := sim.chunks(t, choicesRequest(3))
	got, u := streamChoices(t, chunks)
	if len(got) != 3 {
		t.Fatalf("stream has %d choices, want 3", len(got))
	}
	for i, sc := range got {
		if sc.text != choiceText(want.Choices[i]) || sc.finish != want.Choices[i].FinishReason {
			t.Errorf("streamed choice %d = %q (%s), want the completion's %q (%s)",
				i, sc.text, sc.finish, choiceText(want.Choices[i]), want.Choices[i].FinishReason)
		}
	}
	if u != want.Usage {
		t.Errorf("streamed usage %+v, want the completion's %+v", u, want.Usage)
	}
	// The choices decode side by side in the batch, so their chunks
	// interleave: choice 2 begins before choice 0 ends.
	begin2, end0 := -1, -1
	for i, c := range chunks {
		if c.ID != chunks[0].ID || c.Model != "choices-model" {
			t.Errorf("chunk %d id %q model %q, want one id and the request's model", i, c.ID, c.Model)
		}
		if len(c.Choices) == 0 {
			continue
		}
		if ch := c.Choices[0]; ch.Index == 2 && begin2 < 0 {
			begin2 = i
		} else if ch.Index == 0 && ch.FinishReason != nil {
			end0 = i
		}
	}
	if begin2 < 0 || begin2 > end0 {
		t.Errorf("choice 2 begins at chunk %d, choice 0 ends at %d: want them side by side", begin2, end0)
	}
}

// Every choice keeps to max_tokens, stop and response_format alone.
func TestChoicesHonourTheRequest(t *testing.T) {
	sim := start(t, testConfig())
	full, _ := sim.completionN(t, choicesRequest(3))

	body := choicesRequest(3)
	body["max_tokens"] = 4
	c, _ := sim.completionN(t, body)
	checkChoices(t, c, 3)
	for i, ch := range c.Choices {
		if ch.FinishReason != "length" || len(strings.Fields(choiceText(ch))) != 4 {
			t.Errorf("max_tokens 4: choice %d = %q (%s), want 4 words, length", i, choiceText(ch), ch.FinishReason)
		}
	}
	if c.Usage.CompletionTokens != 12 {
		t.Errorf("max_tokens 4: usage %+v, want 12 completion tokens", c.Usage)
	}

	// Every answer writes a full stop, at its end if not before.
	body = choicesRequest(3)
	body["stop"] = "."
	c, _ = sim.completionN(t, body)
	checkChoices(t, c, 3)
	for i, ch := range c.Choices {
		text := choiceText(ch)
		if ch.FinishReason != "stop" || text == "" || strings.Contains(text, ".") ||
			!strings.HasPrefix(choiceText(full.Choices[i]), text+".") {
			t.Errorf("stop \".\": choice %d = %q (%s), want %q cut before its first full stop",
				i, text, ch.FinishReason, choiceText(full.Choices[i]))
		}
	}

	body = choicesRequest(3)
	body["response_format"] = map[string]any{"type": "json_object"}
	c, _ = sim.completionN(t, body)
	checkChoices(t, c, 3)
	answers := map[string]bool{}
	for i, ch := range c.Choices {
		var out map[string]string
		if err := json.Unmarshal([]byte(choiceText(ch)), &out); err != nil || out["answer"] == "" || ch.FinishReason != "stop" {
			t.Errorf("json_object: choice %d = %q (%s, %v), want {\"answer\": words}", i, choiceText(ch), ch.FinishReason, err)
		}
		answers[out["answer"]] = true
	}
	if len(answers) != 3 {
		t.Errorf("json_object: choices are not three different answers: %+v", c.Choices)
	}
}

// Greedy decoding writes one answer, as a real model does, in every choice.
func TestChoicesGreedy(t *testing.T) {
	sim := start(t, testConfig())
	body := choicesRequest(2)
	body["temperature"] = 0
	c, _ := sim.completionN(t, body)
	checkChoices(t, c, 2)
	if choiceText(c.Choices[0]) != choiceText(c.Choices[1]) {
		t.Errorf("greedy choices differ: %q, %q", choiceText(c.Choices[0]), choiceText(c.Choices[1]))
	}
}

func TestChoicesToolCalls(t *testing.T) {
	sim := start(t, testConfig())
	body := toolRequest()
	body["n"] = 3
	c, raw := sim.completionN(t, body)
	checkChoices(t, c, 3)
	ids := map[string]bool{}
	for i, ch := range c.Choices {
		calls := ch.Message.ToolCalls
		if ch.Message.Content != nil || len(calls) != 1 || calls[0].Function.Name != "get_weather" || ch.FinishReason != "tool_calls" {
			t.Fatalf("choice %d = %+v, want one get_weather call, finish tool_calls: %s", i, ch, raw)
		}
		checkWeatherArgs(t, calls[0].Function.Arguments)
		ids[calls[0].ID] = true
	}
	if len(ids) != 3 {
		t.Errorf("calls share ids: %s", raw)
	}

	got, u := streamChoices(t, sim.chunks(t, body))
	if len(got) != 3 || u != c.Usage {
		t.Fatalf("streamed %d choices, usage %+v; want 3 and %+v", len(got), u, c.Usage)
	}
	for i, sc := range got {
		if sc.text != "" || !slices.Equal(sc.calls, c.Choices[i].Message.ToolCalls) || sc.finish != "tool_calls" {
			t.Errorf("streamed choice %d = %+v, want the completion's %+v", i, sc, c.Choices[i].Message.ToolCalls)
		}
	}

	// Greedy choices make the same call, but a call's id is the server's.
	body["temperature"] = 0
	c, raw = sim.completionN(t, body)
	a, b := c.Choices[0].Message.ToolCalls[0], c.Choices[1].Message.ToolCalls[0]
	if a.Function != b.Function || a.ID == b.ID {
		t.Errorf("greedy calls %+v and %+v, want the same function and arguments, ids apart: %s", a, b, raw)
	}
}

func TestRefuseN(t *testing.T) {
	cfg := testConfig()
	cfg.RefuseParams = []string{"n"}
	sim := start(t, cfg)
	want := `{"error":{"message":"n is not supported by this model","type":"invalid_request_error","param":"n"}}`
	for _, n := range []string{"2", "0", "9"} {
		status, raw := sim.postChat(t, `{"messages":[{"role":"user","content":"hi"}],"n":`+n+`}`)
		if status != http.StatusBadRequest || strings.TrimSpace(string(raw)) != want {
			t.Errorf("n=%s: got %d %s, want 400 %s", n, status, raw, want)
		}
	}
	for _, extra := range []string{`,"n":1`, `,"n":null`, ``} {
		if status, raw := sim.postChat(t, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2`+extra+`}`); status != http.StatusOK {
			t.Errorf("%q: got %d %s, want 200", extra, status, raw)
		}
	}
	if status, _, raw := sim.setConfig(t, `{"refuse_params": []}`); status != http.StatusOK {
		t.Fatalf("clear refuse_params: %d %s", status, raw)
	}
	if c, _ := sim.completionN(t, map[string]any{"messages": userMsg("hi"), "max_tokens": 2, "n": 2}); len(c.Choices) != 2 {
		t.Errorf("n=2 after clearing refuse_params: %d choices", len(c.Choices))
	}
	if status, _, raw := sim.setConfig(t, `{"refuse_params": ["n", "seed"]}`); status != http.StatusOK {
		t.Fatalf("refuse n by /admin/config: %d %s", status, raw)
	}
	if status, _ := sim.postChat(t, `{"messages":[{"role":"user","content":"hi"}],"n":3}`); status != http.StatusBadRequest {
		t.Errorf("n=3 after refusing it by /admin/config: %d", status)
	}
}

// The choices of one request are sequences sharing one prompt: each takes
// a batch slot and KV blocks of its own for what it writes, the prompt's
// full blocks are held once and its tokens prefilled once.
func TestChoicesShareThePrompt(t *testing.T) {
	cfg := testConfig()
	sim := start(t, cfg)
	question := strings.Repeat("Which blocks of the paged cache does a forked sequence share? ", 6)
	probe, _ := sim.completion(t, map[string]any{"messages": userMsg(question), "max_tokens": 1})
	p := probe.Usage.PromptTokens
	if p < 2*cfg.BlockSize {
		t.Fatalf("prompt of %d tokens, want several blocks", p)
	}

	// A stalled engine admits the sequences and holds them as admitted.
	if _, err := sim.Reconfigure(llmsim.ConfigUpdate{Fault: &llmsim.Fault{StallFirstToken: true}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := post(ctx, sim.client, sim.url+"/v1/chat/completions",
			map[string]any{"messages": userMsg(question), "n": 3}); err == nil {
			resp.Body.Close()
		}
	}()
	st := sim.waitFor(t, "three sequences running", func(st llmsim.Stats) bool { return st.Running == 3 })
	shared := p / cfg.BlockSize
	own := (p+1+cfg.BlockSize-1)/cfg.BlockSize - shared
	if want := shared + 3*own; st.UsedBlocks != want || st.Waiting != 0 {
		t.Errorf("n=3 holds %d blocks (%d waiting), want %d shared + 3 × %d own", st.UsedBlocks, st.Waiting, shared, own)
	}
	vals, _ := sim.scrape(t)
	if got := vals[`vllm:prompt_tokens_total{model_name="sluice-sim"}`]; got != float64(2*p) {
		t.Errorf("prompt tokens %v, want %d: the probe's and the n=3 request's, once", got, 2*p)
	}
	cancel()
	<-done
	sim.waitFor(t, "the sequences to free every block", func(st llmsim.Stats) bool {
		return st.Running == 0 && st.Waiting == 0 && st.UsedBlocks == 0
	})
}

// Choices that do not all fit the batch, or the KV cache, wait or are
// preempted like any sequence, and still write their own answers; their
// prompt's shared blocks are freed with the last of them.
func TestChoicesUnderPressure(t *testing.T) {
	roomy := testConfig()
	roomy.AnswerMinTokens, roomy.AnswerMaxTokens = 90, 90
	tight := roomy
	tight.MaxNumSeqs = 2
	tight.KVCacheBlocks = 8 // 128 tokens: one choice's whole answer fits, three do not
	ref, sim := start(t, roomy), start(t, tight)
	body := map[string]any{"messages": userMsg("Which sequence does the scheduler preempt?"), "n": 3}
	want, _ := ref.completionN(t, body)

	stop := make(chan struct{})
	samples := sim.monitor(stop)
	got, _ := sim.completionN(t, body)
	close(stop)
	checkChoices(t, got, 3)
	for i := range got.Choices {
		if choiceText(got.Choices[i]) != choiceText(want.Choices[i]) || got.Choices[i].FinishReason != "stop" {
			t.Errorf("choice %d under pressure = %q (%s), want %q", i, choiceText(got.Choices[i]),
				got.Choices[i].FinishReason, choiceText(want.Choices[i]))
		}
	}
	if got.Usage != want.Usage {
		t.Errorf("usage under pressure %+v, want %+v", got.Usage, want.Usage)
	}
	waited := false
	for _, st := range <-samples {
		if st.Running > 2 {
			t.Fatalf("%d sequences running with MaxNumSeqs=2", st.Running)
		}
		waited = waited || st.Waiting > 0
	}
	st := sim.Stats()
	if !waited || st.Preemptions == 0 {
		t.Errorf("waited %v, %d preemptions: want the third choice queued and the cache to preempt", waited, st.Preemptions)
	}
	if st.UsedBlocks != 0 || st.Running+st.Waiting != 0 {
		t.Errorf("after the request: %+v, want an empty cache", st)
	}
}

// openai-go's accumulator must build the choices of a stream of several
// as it does OpenAI's.
func TestChoicesWithOpenAIClient(t *testing.T) {
	sim := start(t, testConfig())
	client := oai.NewClient(option.WithBaseURL(sim.url+"/v1/"), option.WithAPIKey("test"), option.WithMaxRetries(0))
	params := oai.ChatCompletionNewParams{
		Model:         "choices-model",
		Messages:      []oai.ChatCompletionMessageParamUnion{oai.UserMessage(choicesQuestion)},
		N:             oai.Int(3),
		Seed:          oai.Int(7),
		StreamOptions: oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	var acc oai.ChatCompletionAccumulator
	for stream.Next() {
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("accumulator refused chunk %s", stream.Current().RawJSON())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	c, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(acc.Choices) != 3 || len(c.Choices) != 3 {
		t.Fatalf("accumulated %d choices, completion %d; want 3", len(acc.Choices), len(c.Choices))
	}
	for i, ch := range acc.Choices {
		if ch.Index != int64(i) || ch.Message.Content != c.Choices[i].Message.Content || ch.FinishReason != "stop" {
			t.Errorf("accumulated choice %d = %d %q (%s), want the completion's %q",
				i, ch.Index, ch.Message.Content, ch.FinishReason, c.Choices[i].Message.Content)
		}
	}
	if acc.Usage.CompletionTokens != c.Usage.CompletionTokens {
		t.Errorf("accumulated usage %+v, want %+v", acc.Usage, c.Usage)
	}
}
