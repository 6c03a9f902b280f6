// Package embed turns query text into vectors: a built-in hashed n-gram
// embedder (Local), a client for OpenAI-compatible embedding servers
// (OpenAI) and the first cache tier in front of either (Cache).
package embed

import (
	"context"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Embedder computes one vector per text.
type Embedder interface {
	// Model names the model and its version (e.g. "local-hash-v1/256").
	// Two embedders with the same Model must return the same vectors for
	// the same text, because the name is part of every cache key.
	Model() string
	// Embed returns len(texts) vectors, in the order of texts.
	Embed(ctx context.Context, texts []string) ([][]float32, error)
}

// NormalizeQuery trims q, collapses every run of white space to one space
// and, unless keepCase is set, lower-cases it. Queries that differ only in
// these ways share cache entries. It returns q itself when q is already
// normalised, so repeated identical queries do not allocate.
func NormalizeQuery(q string, keepCase bool) string {
	if isNormalized(q, keepCase) {
		return q
	}
	var b strings.Builder
	b.Grow(len(q))
	space := false
	for _, r := range q {
		if unicode.IsSpace(r) {
			space = b.Len() > 0
			continue
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		if !keepCase {
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

func isNormalized(q string, keepCase bool) bool {
	prevSpace := true // a leading space is not normalised
	for i := 0; i < len(q); {
		c := q[i]
		if c < utf8.RuneSelf {
			switch {
			case c == ' ':
				if prevSpace {
					return false
				}
				prevSpace = true
			case c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r':
				return false
			case !keepCase && 'A' <= c && c <= 'Z':
				return false
			default:
				prevSpace = false
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(q[i:])
		if unicode.IsSpace(r) || (!keepCase && unicode.ToLower(r) != r) {
			return false
		}
		prevSpace = false
		i += n
	}
	return !prevSpace || q == ""
}
