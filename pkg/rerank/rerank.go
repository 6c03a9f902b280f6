// Package rerank reorders retrieved candidates and keeps the best k: a
// built-in lexical reranker and a client for cross-encoder rerank servers.
package rerank

import (
	"context"
	"slices"

	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// Reranker orders candidate chunks for a query and keeps the best k.
type Reranker interface {
	// Version names the reranker and its settings; it belongs in the key
	// of any cache that holds reranked results.
	Version() string
	// Rerank returns at most k chunks (all if k <= 0), best first, with
	// Score set to the reranker's score. It does not modify chunks.
	Rerank(ctx context.Context, query string, chunks []retrieval.Chunk, k int) ([]retrieval.Chunk, error)
}

// scored is a candidate's position in the input and its new score.
type scored struct {
	idx   int
	score float64
}

// top sorts by score, best first, keeping input order among equal scores
// (the retriever's order is the better tie-breaker than none), and returns
// the best k chunks with their new scores.
func top(chunks []retrieval.Chunk, s []scored, k int) []retrieval.Chunk {
	slices.SortStableFunc(s, func(a, b scored) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return 0
	})
	if k <= 0 || k > len(s) {
		k = len(s)
	}
	out := make([]retrieval.Chunk, k)
	for i := range out {
		out[i] = chunks[s[i].idx]
		out[i].Score = s[i].score
	}
	return out
}
