// Package prompt builds the chat prompt sent to the LLM from the system
// prompt, the retrieved context and the user's query, counts it, and bounds
// its size cheaply before it is built (admission must pick a pool before
// retrieval has run, and the stream should not wait for a full count).
package prompt

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// Builder builds and measures prompts around one system prompt.
type Builder struct {
	system  string
	memo    *tokens.Memo
	version string
}

// templateVersion names the layout Conversation gives a prompt. Change it
// with the layout: cached answers (the L3 tier) are keyed by Version, and
// an answer asked with another layout is another answer.
const templateVersion = "t1"

// NewBuilder returns a Builder; counts of the system prompt and of chunks
// are remembered in a bounded memo.
func NewBuilder(system string, c *tokens.Counter) *Builder {
	sum := sha256.Sum256([]byte(system))
	return &Builder{system: system, memo: c.NewMemo(50000), version: templateVersion + "-" + hex.EncodeToString(sum[:6])}
}

// Version names the prompt template: its layout and its system prompt.
func (b *Builder) Version() string { return b.version }

// contextHeader opens the context section of the system message.
const contextHeader = "\n\nContext:\n"

// Exchange is one earlier turn of a conversation as the model sees it:
// what the user asked and what they were answered (or told instead).
type Exchange struct {
	User, Assistant string
}

// Messages returns the prompt: one system message carrying the
// instructions and the numbered context chunks, then the user's query.
func (b *Builder) Messages(chunks []retrieval.Chunk, query string) []openai.Message {
	return b.Conversation(nil, chunks, query)
}

// Conversation is Messages with earlier exchanges between the system
// message and the query, oldest first.
func (b *Builder) Conversation(history []Exchange, chunks []retrieval.Chunk, query string) []openai.Message {
	msgs := make([]openai.Message, 0, 2+2*len(history))
	msgs = append(msgs, b.systemMessage(chunks))
	for _, e := range history {
		msgs = append(msgs, openai.TextMessage(openai.RoleUser, e.User), openai.TextMessage(openai.RoleAssistant, e.Assistant))
	}
	return append(msgs, openai.TextMessage(openai.RoleUser, query))
}

// Around is the prompt of a client's own conversation answered from a
// knowledge base: the system message with the context, then the
// conversation as the client sent it (its own system message included,
// after Sluice's, so that the client's instructions have the last word).
func (b *Builder) Around(chunks []retrieval.Chunk, conversation []openai.Message) []openai.Message {
	return append([]openai.Message{b.systemMessage(chunks)}, conversation...)
}

// systemMessage is the system message: the instructions, then the numbered
// context chunks.
func (b *Builder) systemMessage(chunks []retrieval.Chunk) openai.Message {
	var s strings.Builder
	s.WriteString(b.system)
	if len(chunks) > 0 {
		s.WriteString(contextHeader)
		for i, c := range chunks {
			s.WriteString("[")
			s.WriteString(strconv.Itoa(i + 1))
			s.WriteString("] ")
			if c.Title != "" {
				s.WriteString(c.Title)
				s.WriteString("\n")
			}
			s.WriteString(c.Text)
			s.WriteString("\n\n")
		}
	}
	return openai.TextMessage(openai.RoleSystem, strings.TrimRight(s.String(), "\n"))
}

// perMessageFraming bounds the tokens a chat format adds around one
// message's content (its role and separators).
const perMessageFraming = 8

// ExchangeTokens bounds what e adds to a prompt.
func (b *Builder) ExchangeTokens(e Exchange) int {
	return b.memo.Count(e.User) + b.memo.Count(e.Assistant) + 2*perMessageFraming
}

// FitHistory keeps the most recent exchanges whose tokens fit budget,
// oldest first, and returns them with the tokens they add. The newest
// exchange is what a follow-up question most likely refers to, so an
// older one never displaces it; one that alone exceeds the budget ends
// the history there (a gap in the middle would confuse the model more
// than a shorter memory).
func (b *Builder) FitHistory(history []Exchange, budget int) ([]Exchange, int) {
	used := 0
	i := len(history)
	for i > 0 {
		n := b.ExchangeTokens(history[i-1])
		if used+n > budget {
			break
		}
		used += n
		i--
	}
	return history[i:], used
}

// Count returns the exact token count of msgs' text as a chat model sees
// it (Message.Text: parts that are not text are not counted here).
func (b *Builder) Count(msgs []openai.Message) int {
	tm := make([]tokens.Message, len(msgs))
	for i, m := range msgs {
		// A message whose content does not decode counts as empty: the
		// door refuses such messages before anything is counted.
		text, _ := m.Text()
		tm[i] = tokens.Message{Role: m.Role, Content: text}
	}
	return b.memo.Counter().CountChat(tm)
}

// perChunkFraming bounds the tokens Messages adds around one chunk (the
// "[n] " marker, newlines) plus the tokens that tokenizing the chunk apart
// from its neighbours can differ by.
const perChunkFraming = 12

// chatFraming bounds the per-message and reply-priming tokens of two messages.
const chatFraming = 16

// Bound is an upper estimate of the count of Messages(chunks, query),
// from remembered part counts: summing parts tokenized apart over-counts
// at worst by the framing margins, which it adds on top.
func (b *Builder) Bound(chunks []retrieval.Chunk, query string) int {
	n := b.memo.Count(b.system) + b.memo.Counter().Count(query) + chatFraming
	if len(chunks) > 0 {
		n += b.memo.Count(contextHeader)
	}
	for _, c := range chunks {
		n += b.memo.Count(c.Title) + b.memo.Count(c.Text) + perChunkFraming
	}
	return n
}

// BoundBeforeRetrieval bounds the prompt once k chunks of at most
// chunkTokens each are retrieved. Admission routes with it, so a request
// admitted to the short pool cannot outgrow it.
func (b *Builder) BoundBeforeRetrieval(query string, k, chunkTokens int) int {
	return b.BoundForQueryTokens(b.QueryTokens(query), k, chunkTokens)
}

// QueryTokens counts a query's tokens: the costly part of a bound (a
// tiktoken encode), to be done once per request.
func (b *Builder) QueryTokens(query string) int { return b.memo.Counter().Count(query) }

// BoundForQueryTokens is BoundBeforeRetrieval for a query of queryTokens.
func (b *Builder) BoundForQueryTokens(queryTokens, k, chunkTokens int) int {
	n := b.memo.Count(b.system) + queryTokens + chatFraming
	if k > 0 {
		n += b.memo.Count(contextHeader) + k*(chunkTokens+perChunkFraming)
	}
	return n
}
