// Package ingest turns documents into stored knowledge-base revisions:
// chunked, embedded and written to the kbstore in one change. A document
// whose content, chunking and embedder are unchanged is not embedded again
// (its revision, a content hash, is already stored), so re-ingesting a
// corpus costs one Redis read.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// Document is a source text to ingest.
type Document struct {
	ID       string            `json:"id"`
	Title    string            `json:"title"`
	Text     string            `json:"text"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// Limits on what is accepted.
const (
	MaxIDBytes    = 256
	MaxTitleBytes = 1024
	MaxTextBytes  = 2 << 20
	MaxMetadata   = 32
)

// ErrInvalid wraps every error about the documents themselves (the
// caller's mistake, a 400), as opposed to failures to store them.
var ErrInvalid = errors.New("invalid document")

// Ingester chunks, embeds and stores documents.
type Ingester struct {
	Store    *kbstore.Store
	Embedder embed.Embedder
	Chunking retrieval.ChunkOptions
	// BatchSize is the number of chunks per Embed call. Default 64.
	BatchSize int
	// MaxMetadataBytes bounds a document's metadata, its keys and values
	// together (kbstore.MetadataBytes). Default DefaultMaxMetadataBytes.
	MaxMetadataBytes int
}

// DefaultMaxMetadataBytes is a document's metadata limit when the
// Ingester names none: room for a source URL, an author and a few tags,
// not a second body.
const DefaultMaxMetadataBytes = 8 << 10

func (g *Ingester) maxMetadataBytes() int {
	if g.MaxMetadataBytes > 0 {
		return g.MaxMetadataBytes
	}
	return DefaultMaxMetadataBytes
}

// DocResult is what became of one document.
type DocResult struct {
	ID     string `json:"id"`
	Rev    string `json:"rev"`
	Chunks int    `json:"chunks"`
	// Changed is false when the same content was already stored.
	Changed bool `json:"changed"`
}

// Result is the outcome of Put.
type Result struct {
	KB      string      `json:"kb"`
	Version int64       `json:"version"`
	Docs    []DocResult `json:"documents"`
}

// Bytes is what the document would store, as its owner's ingestion quota
// counts it: title, text and metadata.
func (d Document) Bytes() int64 {
	return int64(len(d.Title)+len(d.Text)) + kbstore.MetadataBytes(d.Metadata)
}

// Validate checks one document against the Ingester's limits.
func (g *Ingester) Validate(d Document) error {
	switch {
	case d.ID == "" || len(d.ID) > MaxIDBytes:
		return fmt.Errorf("%w: id must be 1-%d bytes", ErrInvalid, MaxIDBytes)
	case strings.ContainsAny(d.ID, "#@") || strings.ContainsFunc(d.ID, unicode.IsControl) || !utf8.ValidString(d.ID):
		return fmt.Errorf("%w: id %q may not contain '#', '@' or control characters", ErrInvalid, d.ID)
	case len(d.Title) > MaxTitleBytes || !utf8.ValidString(d.Title):
		return fmt.Errorf("%w: document %s: title must be valid UTF-8 of at most %d bytes", ErrInvalid, d.ID, MaxTitleBytes)
	case strings.TrimSpace(d.Text) == "":
		return fmt.Errorf("%w: document %s has no text", ErrInvalid, d.ID)
	case len(d.Text) > MaxTextBytes || !utf8.ValidString(d.Text):
		return fmt.Errorf("%w: document %s: text must be valid UTF-8 of at most %d bytes", ErrInvalid, d.ID, MaxTextBytes)
	case len(d.Metadata) > MaxMetadata:
		return fmt.Errorf("%w: document %s: at most %d metadata entries", ErrInvalid, d.ID, MaxMetadata)
	case kbstore.MetadataBytes(d.Metadata) > int64(g.maxMetadataBytes()):
		return fmt.Errorf("%w: document %s: metadata of %d bytes (keys and values) is over the limit of %d", ErrInvalid, d.ID,
			kbstore.MetadataBytes(d.Metadata), g.maxMetadataBytes())
	}
	return nil
}

// Put stores docs in kb (a kbref key: a shared kb's name, or a tenant's
// own kb) as one change and returns the kb's version after it. Every
// document is validated before anything is embedded.
func (g *Ingester) Put(ctx context.Context, kb string, docs []Document) (Result, error) {
	ref, err := kbref.ParseKey(kb)
	if err != nil {
		return Result{}, fmt.Errorf("%w: %w: use %s", ErrInvalid, err, kbref.NameRule)
	}
	if len(docs) == 0 {
		return Result{}, fmt.Errorf("%w: no documents", ErrInvalid)
	}
	seen := map[string]bool{}
	for _, d := range docs {
		if err := g.Validate(d); err != nil {
			return Result{}, err
		}
		if seen[d.ID] {
			return Result{}, fmt.Errorf("%w: document id %q given twice", ErrInvalid, d.ID)
		}
		seen[d.ID] = true
	}
	model := g.Embedder.Model()
	chunking := g.Chunking.String()
	ids := make([]string, len(docs))
	revs := make([]string, len(docs))
	for i, d := range docs {
		ids[i] = d.ID
		revs[i] = kbstore.RevisionHash(d.ID, d.Title, d.Text, d.Metadata, chunking, model)
	}
	stored, err := g.Store.Revs(ctx, kb, ids)
	if err != nil {
		return Result{}, err
	}
	// The client named the kb by its name; its owner is the client.
	res := Result{KB: ref.Name, Docs: make([]DocResult, len(docs))}
	var todo []kbstore.Revision
	var at []int // index into docs of each of todo
	for i, d := range docs {
		chunks := retrieval.Split(d.Text, g.Chunking)
		if len(chunks) == 0 {
			return Result{}, fmt.Errorf("%w: document %s has no text to index", ErrInvalid, d.ID)
		}
		res.Docs[i] = DocResult{ID: d.ID, Rev: revs[i], Chunks: len(chunks)}
		if stored[i] == revs[i] {
			continue
		}
		title := d.Title
		if title == "" {
			title = d.ID
		}
		todo = append(todo, kbstore.Revision{ID: d.ID, Rev: revs[i], Title: title, Metadata: d.Metadata, Chunks: chunks})
		at = append(at, i)
	}
	if len(todo) == 0 {
		if res.Version, err = g.Store.Version(ctx, kb); err != nil {
			return Result{}, err
		}
		return res, nil
	}
	if err := g.embed(ctx, todo); err != nil {
		return Result{}, err
	}
	for i := range todo {
		todo[i].Memory = retrieval.EstimateBytes(todo[i])
	}
	put, err := g.Store.Put(ctx, kb, model, todo)
	if err != nil {
		if errors.Is(err, kbstore.ErrModelMismatch) {
			return Result{}, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		return Result{}, err
	}
	res.Version = put.Version
	for j, i := range at {
		res.Docs[i].Changed = put.Changed[j]
	}
	return res, nil
}

// embed fills in the vectors of revs, embedding title and chunk together
// as retrieval indexes them (later chunks often no longer name their
// document's topic; the title does).
func (g *Ingester) embed(ctx context.Context, revs []Revision) error {
	batch := g.BatchSize
	if batch <= 0 {
		batch = 64
	}
	type ref struct{ r, c int }
	var texts []string
	var refs []ref
	for i, r := range revs {
		for j, c := range r.Chunks {
			texts = append(texts, r.Title+"\n\n"+c)
			refs = append(refs, ref{i, j})
		}
	}
	for lo := 0; lo < len(texts); lo += batch {
		hi := min(lo+batch, len(texts))
		vecs, err := g.Embedder.Embed(ctx, texts[lo:hi])
		if err != nil {
			return fmt.Errorf("embed chunks %d-%d with %s: %w", lo, hi-1, g.Embedder.Model(), err)
		}
		if len(vecs) != hi-lo {
			return fmt.Errorf("embed chunks %d-%d with %s: got %d vectors", lo, hi-1, g.Embedder.Model(), len(vecs))
		}
		for k, v := range vecs {
			rf := refs[lo+k]
			r := &revs[rf.r]
			if r.Dims == 0 {
				r.Dims = len(v)
			}
			if len(v) != r.Dims || len(v) == 0 {
				return fmt.Errorf("embed chunk %d of %s with %s: %d dimensions, want %d", rf.c, r.ID, g.Embedder.Model(), len(v), r.Dims)
			}
			v = append([]float32(nil), v...)
			embed.Normalize(v)
			r.Vectors = append(r.Vectors, v...)
		}
	}
	return nil
}

// Revision is kbstore's, named here for embed's signature.
type Revision = kbstore.Revision
