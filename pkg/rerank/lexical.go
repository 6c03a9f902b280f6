package rerank

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"

	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// LexicalOptions configures Lexical.
type LexicalOptions struct {
	// Weight is the share of the lexical score in the fused score; the
	// incoming retrieval score has the rest. Default 0.5.
	Weight float64
	// BM25 sets k1 and b (defaults 1.2 and 0.75).
	BM25 retrieval.BM25Options
}

// Lexical reranks by BM25 computed over the candidate set alone, fused
// with the retrieval score. Over the candidates, a term's IDF says how well
// it separates them rather than how rare it is in the whole kb: a query
// term every candidate contains counts for little, one only two contain
// decides between them. BM25 and the retrieval score are each scaled to
// [0, 1] over the candidates (divided by their maximum, or min-max
// normalised if retrieval scores go negative), which makes the fusion
// independent of the retriever's score scale, and added with Weight:
// fused = Weight*bm25' + (1-Weight)*retrieval'. It is safe for concurrent
// use.
type Lexical struct {
	weight  float64
	k1, b   float64
	version string
	scratch sync.Pool // *lexicalScratch
}

type lexicalScratch struct {
	qtok, ctok retrieval.Tokenizer
	qterms     [][]byte
	idf        []float64
	tf         []int32 // candidate i, query term j at i*len(qterms)+j
	lengths    []int32
	s          []scored
}

// NewLexical returns a Lexical reranker.
func NewLexical(opts LexicalOptions) *Lexical {
	if opts.Weight <= 0 || opts.Weight > 1 {
		opts.Weight = 0.5
	}
	k1, b := opts.BM25.K1, opts.BM25.B
	if k1 <= 0 {
		k1 = 1.2
	}
	if b <= 0 {
		b = 0.75
	}
	l := &Lexical{
		weight: opts.Weight, k1: k1, b: b,
		version: "lexical-v1/w" + strconv.FormatFloat(opts.Weight, 'g', 3, 64) +
			"/k1=" + strconv.FormatFloat(k1, 'g', 3, 64) + "/b=" + strconv.FormatFloat(b, 'g', 3, 64),
	}
	l.scratch.New = func() any { return new(lexicalScratch) }
	return l
}

// Version returns "lexical-v1/w<weight>/k1=<k1>/b=<b>".
func (l *Lexical) Version() string { return l.version }

// Rerank scores chunks by their title and text.
func (l *Lexical) Rerank(ctx context.Context, query string, chunks []retrieval.Chunk, k int) ([]retrieval.Chunk, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("rerank %d chunks: %w", len(chunks), err)
	}
	if len(chunks) == 0 {
		return []retrieval.Chunk{}, nil
	}
	s := l.scratch.Get().(*lexicalScratch)
	defer l.scratch.Put(s)

	s.qterms = s.qterms[:0]
	for _, t := range s.qtok.Terms(query) {
		if !containsTerm(s.qterms, t) {
			s.qterms = append(s.qterms, t)
		}
	}
	nq, n := len(s.qterms), len(chunks)
	s.tf = resize(s.tf, n*nq)
	s.lengths = resize(s.lengths, n)
	clear(s.tf)
	total := 0
	for i, c := range chunks {
		if nq == 0 {
			break // nothing to count: the retrieval order stands
		}
		row := s.tf[i*nq : (i+1)*nq]
		length := l.count(s, row, c.Title) + l.count(s, row, c.Text)
		s.lengths[i] = int32(length)
		total += length
	}
	avgLen := max(float64(total)/float64(n), 1)

	// Lucene's IDF over the candidates; it stays positive when a term is
	// in all of them.
	s.idf = resize(s.idf, nq)
	idf := s.idf
	for j := range nq {
		df := 0
		for i := range n {
			if s.tf[i*nq+j] > 0 {
				df++
			}
		}
		idf[j] = math.Log(1 + (float64(n)-float64(df)+0.5)/(float64(df)+0.5))
	}

	s.s = s.s[:0]
	lexMax, retMin, retMax := 0.0, math.Inf(1), math.Inf(-1)
	for i, c := range chunks {
		norm := l.k1 * (1 - l.b + l.b*float64(s.lengths[i])/avgLen)
		var bm float64
		for j := range nq {
			if tf := float64(s.tf[i*nq+j]); tf > 0 {
				bm += idf[j] * tf * (l.k1 + 1) / (tf + norm)
			}
		}
		s.s = append(s.s, scored{idx: i, score: bm})
		lexMax = max(lexMax, bm)
		retMin, retMax = min(retMin, c.Score), max(retMax, c.Score)
	}
	// BM25 is never negative and most candidate sets have a chunk without
	// any query term, so it is scaled by its maximum alone.
	var lexScale, retScale float64
	if lexMax > 0 {
		lexScale = l.weight / lexMax
	}
	// Non-negative retrieval scores (Hybrid's are in [0, 1]) are divided by
	// their maximum too, which keeps their ratios: min-max would give the
	// last candidate 0 even if it trailed the first by a hair. Scores that
	// go negative need min-max.
	retOffset := 0.0
	switch {
	case retMin >= 0 && retMax > 0:
		retScale = (1 - l.weight) / retMax
	case retMin < 0 && retMax > retMin:
		retScale = (1 - l.weight) / (retMax - retMin)
		retOffset = retMin
	}
	for i := range s.s {
		s.s[i].score = lexScale*s.s[i].score + retScale*(chunks[i].Score-retOffset)
	}
	return top(chunks, s.s, k), nil
}

// count adds the occurrences of each query term in text to row and returns
// the number of terms in text.
func (l *Lexical) count(s *lexicalScratch, row []int32, text string) int {
	terms := s.ctok.Terms(text)
	for _, t := range terms {
		for j, q := range s.qterms {
			if bytes.Equal(t, q) {
				row[j]++
				break
			}
		}
	}
	return len(terms)
}

func containsTerm(terms [][]byte, t []byte) bool {
	for _, x := range terms {
		if bytes.Equal(x, t) {
			return true
		}
	}
	return false
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
