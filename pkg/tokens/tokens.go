// Package tokens counts tokens with tiktoken, offline: the BPE files are
// embedded by tiktoken-go-loader, so no download happens at run time.
package tokens

import (
	"fmt"
	"sync"

	"github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// Encodings Sluice supports.
const (
	CL100K = "cl100k_base"
	O200K  = "o200k_base"
)

// Counter counts tokens of one encoding. It is safe for concurrent use;
// build it once per process with For (building one takes ~100 ms).
type Counter struct {
	name string
	enc  *tiktoken.Tiktoken
}

var (
	// tiktoken-go keeps its BPE loader in a package variable; setting it
	// once is the only global state this package has.
	loaderOnce sync.Once

	mu       sync.Mutex
	counters = map[string]*Counter{}
)

// For returns the shared Counter for an encoding, loading it on first use.
func For(encoding string) (*Counter, error) {
	loaderOnce.Do(func() { tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader()) })
	mu.Lock()
	defer mu.Unlock()
	if c, ok := counters[encoding]; ok {
		return c, nil
	}
	switch encoding {
	case CL100K, O200K:
	default:
		return nil, fmt.Errorf("load tokenizer: unsupported encoding %q (want %s or %s)", encoding, CL100K, O200K)
	}
	enc, err := tiktoken.GetEncoding(encoding)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer %s: %w", encoding, err)
	}
	c := &Counter{name: encoding, enc: enc}
	counters[encoding] = c
	return c, nil
}

// Encoding names the counter's encoding.
func (c *Counter) Encoding() string { return c.name }

// Count returns the number of tokens in text. Special-token text such as
// "<|endoftext|>" is counted as ordinary text, because user input must never
// be interpreted as control tokens.
func (c *Counter) Count(text string) int {
	if text == "" {
		return 0
	}
	return len(c.enc.EncodeOrdinary(text))
}

// ChatOverhead is the per-message framing OpenAI chat models add around
// each message (role and separators), and the priming of the reply.
const (
	perMessageTokens = 3
	replyPriming     = 3
)

// Message is one chat message as counted.
type Message struct {
	Role    string
	Content string
}

// CountChat counts a chat prompt the way OpenAI's cookbook does for
// gpt-3.5/4-family models: content tokens plus fixed framing per message.
func (c *Counter) CountChat(msgs []Message) int {
	n := replyPriming
	for _, m := range msgs {
		n += perMessageTokens + c.Count(m.Role) + c.Count(m.Content)
	}
	return n
}

// Memo remembers the counts of texts that recur — system prompts and
// knowledge-base chunks — so that routing and prompt budgeting do not
// re-tokenize them on every request. It is bounded and safe for concurrent
// use.
type Memo struct {
	c   *Counter
	max int

	mu sync.Mutex
	m  map[string]int
}

// NewMemo returns a Memo holding up to max texts. When full it starts
// over: recurring texts are few and come back at once.
func (c *Counter) NewMemo(max int) *Memo {
	return &Memo{c: c, max: max, m: make(map[string]int, 64)}
}

// Count returns c.Count(text), from memory when it has seen text before.
func (m *Memo) Count(text string) int {
	m.mu.Lock()
	n, ok := m.m[text]
	m.mu.Unlock()
	if ok {
		return n
	}
	n = m.c.Count(text)
	m.mu.Lock()
	if len(m.m) >= m.max {
		clear(m.m)
	}
	m.m[text] = n
	m.mu.Unlock()
	return n
}

// Counter returns the underlying counter.
func (m *Memo) Counter() *Counter { return m.c }
