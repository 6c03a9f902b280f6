// Package retrieval holds the knowledge bases a chat request can draw on
// and finds the chunks relevant to a query: exact hybrid search (BM25 and
// cosine similarity over every chunk) and the second cache tier, whose keys
// carry the knowledge base version so that a content change retires every
// old entry at once.
package retrieval

import (
	"context"
	"errors"
	"fmt"
)

// Chunk is a passage of a document, as retrieved.
type Chunk struct {
	ID    string `json:"id"`
	DocID string `json:"doc_id"`
	Title string `json:"title"`
	Text  string `json:"text"`
	// Score is the relevance the producing stage gave the chunk; higher is
	// better. Its scale depends on that stage.
	Score float64 `json:"score"`
}

// Result is what a retrieval returns: the chunks, best first, and the kb
// version they come from.
type Result struct {
	KB        string  `json:"kb"`
	KBVersion int64   `json:"kb_version"`
	Chunks    []Chunk `json:"chunks"`
}

// Query asks for the K best chunks of a kb.
type Query struct {
	KB   string
	Text string
	// Vector is the embedding of Text by the kb's embedder. Without it
	// retrieval is lexical only.
	Vector []float32
	K      int
}

// Retriever finds the chunks of a kb relevant to a query.
type Retriever interface {
	Retrieve(ctx context.Context, q Query) (Result, error)
}

// VersionedRetriever is a Retriever that can pin a kb at the version it
// would answer from now, which a cache needs: the version goes into the
// key before the search, and the search must then be of that version.
type VersionedRetriever interface {
	Retriever
	// Pin returns the kb as it is now, or an *UnknownKBError.
	Pin(ctx context.Context, kb string) (Pinned, error)
}

// Pinned is one version of a kb. It answers from that version however the
// kb has changed since it was pinned (of its own kb only: Query.KB must
// name it).
type Pinned interface {
	Retriever
	Version() int64
}

// ErrUnknownKB matches every *UnknownKBError with errors.Is.
var ErrUnknownKB = errors.New("unknown knowledge base")

// UnknownKBError is returned for a query naming a kb that is not loaded.
// It is the caller's mistake (a 4xx), not a failure to retry. It is
// returned unwrapped so that its type name survives conversion to a
// Temporal application error.
type UnknownKBError struct {
	KB string
}

func (e *UnknownKBError) Error() string { return fmt.Sprintf("unknown knowledge base %q", e.KB) }

// Is makes errors.Is(err, ErrUnknownKB) true.
func (e *UnknownKBError) Is(target error) bool { return target == ErrUnknownKB }
