// Package prompt builds the chat prompt sent to the LLM from the system
// prompt, the retrieved context and the user's query, and estimates its size
// before retrieval has run (admission must pick a pool first).
package prompt

import (
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// Build returns the messages: one system message carrying the instructions
// and the numbered context chunks, then the user's query.
func Build(system string, chunks []retrieval.Chunk, query string) []llm.Message {
	var b strings.Builder
	b.WriteString(system)
	if len(chunks) > 0 {
		b.WriteString("\n\nContext:\n")
		for i, c := range chunks {
			b.WriteString("[")
			b.WriteString(strconv.Itoa(i + 1))
			b.WriteString("] ")
			if c.Title != "" {
				b.WriteString(c.Title)
				b.WriteString("\n")
			}
			b.WriteString(c.Text)
			b.WriteString("\n\n")
		}
	}
	return []llm.Message{
		{Role: "system", Content: strings.TrimRight(b.String(), "\n")},
		{Role: "user", Content: query},
	}
}

// Count returns the prompt's token count as the model will see it.
func Count(c *tokens.Counter, msgs []llm.Message) int {
	tm := make([]tokens.Message, len(msgs))
	for i, m := range msgs {
		tm[i] = tokens.Message{Role: m.Role, Content: m.Content}
	}
	return c.CountChat(tm)
}

// perChunkFraming bounds the tokens Build adds around one chunk: the
// "[n] " marker, the title line and the blank line.
const perChunkFraming = 24

// Estimate is an upper bound of the prompt's size once k chunks of at most
// chunkTokens each are retrieved. Routing at admission uses it, so a
// request admitted to the short pool can never outgrow it.
func Estimate(c *tokens.Counter, system, query string, k, chunkTokens int) int {
	base := Count(c, Build(system, nil, query))
	if k <= 0 {
		return base
	}
	return base + c.Count("\n\nContext:\n") + k*(chunkTokens+perChunkFraming)
}
