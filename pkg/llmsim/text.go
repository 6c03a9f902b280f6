package llmsim

import (
	"encoding/binary"
	"hash/fnv"
	"strings"
	"unicode"

	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// vocabulary gives answers the look of a RAG reply without pretending to be
// one; words of the question are mixed in so answers read as related.
var vocabulary = [...]string{
	"the", "a", "system", "request", "answer", "context", "document", "based",
	"on", "of", "in", "to", "and", "is", "are", "with", "for", "this", "that",
	"it", "can", "should", "will", "may", "when", "under", "load", "latency",
	"queue", "cache", "token", "tokens", "model", "service", "user", "data",
	"result", "results", "retrieval", "index", "query", "response", "time",
	"first", "then", "each", "every", "more", "less", "because", "which",
	"by", "from", "as", "also", "not", "only", "one", "two", "several",
	"important", "simple", "typical", "usually", "often", "here", "there",
	"configuration", "limit", "budget", "batch", "step", "memory", "capacity",
	"throughput", "client", "server", "stream", "reply", "section", "source",
	"example", "case", "value", "setting", "default", "higher", "lower",
	"faster", "slower", "stable", "safe", "needed", "used", "described",
}

// answer generates the deterministic text of one request. Word i depends
// only on the seed, the prompt and i, so a preempted sequence that is
// recomputed continues with exactly the words it would have produced.
type answer struct {
	hash   uint64
	echoes []string
	// choice is the index of the choice the answer writes.
	choice int
}

// newAnswer derives an answer from the seed, every message (role and text)
// and the words of the last user message. When the conversation ends with
// a tool's result, its words come first, so that the answer reads as using
// what the tool returned.
func newAnswer(seed int64, msgs []tokens.Message) answer {
	h := fnv.New64a()
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], uint64(seed))
	h.Write(buf[:])
	lastUser := ""
	for _, m := range msgs {
		h.Write([]byte(m.Role))
		h.Write([]byte{0})
		h.Write([]byte(m.Content))
		h.Write([]byte{0})
		if m.Role == openai.RoleUser {
			lastUser = m.Content
		}
	}
	var echoes []string
	if n := len(msgs); n > 0 && msgs[n-1].Role == openai.RoleTool {
		echoes = echoWords(msgs[n-1].Content)
	}
	return answer{hash: h.Sum64(), echoes: append(echoes, echoWords(lastUser)...)}
}

// withSeed mixes a request's seed into the answer: the same seed and
// prompt give the same answer, another seed another one.
func (a answer) withSeed(seed int64) answer {
	a.hash = mix(a.hash ^ mix(uint64(seed)^0x5eed5eed))
	return a
}

// forChoice is the answer of choice i of a request. Sampling draws every
// choice anew, so each has its own text; greedy decoding writes the same
// text in all of them. Choice 0 is the answer of a request for one.
func (a answer) forChoice(i int, greedy bool) answer {
	a.choice = i
	if i > 0 && !greedy {
		a.hash = mix(a.hash ^ mix(uint64(i)^saltChoice))
	}
	return a
}

// questionWords are too common in questions to make an answer look related.
var questionWords = map[string]bool{
	"what": true, "how": true, "why": true, "when": true, "where": true, "who": true,
	"which": true, "does": true, "did": true, "can": true, "could": true, "would": true,
	"should": true, "the": true, "and": true, "are": true, "you": true, "your": true,
	"for": true, "with": true, "this": true, "that": true, "there": true, "about": true,
}

// echoWords picks the words of the question worth repeating: letters and
// digits only, at least three characters, no question words, at most 64.
func echoWords(text string) []string {
	fields := strings.FieldsFunc(text, func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
	var out []string
	for _, f := range fields {
		w := strings.ToLower(f)
		if len([]rune(w)) >= 3 && !questionWords[w] {
			out = append(out, w)
		}
		if len(out) == 64 {
			break
		}
	}
	return out
}

// mix is splitmix64: a cheap, well-spread hash of (answer, position).
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func (a answer) at(pos int) uint64 { return mix(a.hash ^ mix(uint64(pos)+1)) }

// Salts of the numbers an answer draws apart from its words, so that the
// i-th of one kind is not the i-th of another, nor a word.
const (
	saltNumber = 0x6e756d
	saltEcho   = 0x6563686f
	saltChoice = 0x63686f696365
)

// draw is the i-th number of a kind the answer needs besides words.
func (a answer) draw(salt uint64, i int) uint64 { return mix(a.hash ^ salt ^ mix(uint64(i)+1)) }

// naturalLength is where the answer would end on its own.
func (a answer) naturalLength(min, max int) int {
	span := uint64(max - min + 1)
	return min + int(mix(a.hash^0x5eed)%span)
}

// endsSentence says whether word pos carries a full stop.
func (a answer) endsSentence(pos int) bool {
	return pos >= 3 && (a.at(pos)>>40)%9 == 0
}

// word picks the bare word at pos: one in four from the question.
func (a answer) word(pos int) string {
	r := a.at(pos)
	if len(a.echoes) > 0 && r%4 == 0 {
		return a.echoes[(r>>8)%uint64(len(a.echoes))]
	}
	return vocabulary[(r>>8)%uint64(len(vocabulary))]
}

// token returns the text of generated token pos. Every token is one word,
// with a leading space except the first, as BPE tokens of English are. The
// last token of an answer that stops on its own ends the sentence.
func (a answer) token(pos int, last bool) string {
	w := a.word(pos)
	if pos > 0 && w == a.word(pos-1) {
		// "the the" reads as a bug; take another vocabulary word.
		w = vocabulary[(a.at(pos)>>24)%uint64(len(vocabulary))]
	}
	if pos == 0 || a.endsSentence(pos-1) {
		w = capitalize(w)
	}
	if last || a.endsSentence(pos) {
		w += "."
	}
	if pos > 0 {
		w = " " + w
	}
	return w
}

// phrase is n tokens from position from as a sentence of its own, for a
// string inside JSON: capitalized, no leading space, a full stop at the end.
func (a answer) phrase(from, n int) []string {
	out := make([]string, n)
	for i := range n {
		out[i] = a.token(from+i, i == n-1)
	}
	if n > 0 {
		out[0] = capitalize(strings.TrimPrefix(out[0], " "))
	}
	return out
}

func capitalize(w string) string {
	for i, r := range w {
		return string(unicode.ToUpper(r)) + w[i+len(string(r)):]
	}
	return w
}
