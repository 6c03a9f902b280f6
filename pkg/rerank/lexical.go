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

	s.setQuery(query)
	avgLen := l.countTerms(s, chunks)
	s.setIDF(len(chunks))
	lexMax := l.scoreBM25(s, chunks, avgLen)
	l.fuse(s.s, chunks, lexMax)
	return top(chunks, s.s, k), nil
}

// setQuery sets s.qterms to the distinct terms of query.
func (s *lexicalScratch) setQuery(query string) {
	s.qterms = s.qterms[:0]
	for _, t := range s.qtok.Terms(query) {
		if !containsTerm(s.qterms, t) {
			s.qterms = append(s.qterms, t)
		}
	}
}

// countTerms sets s.tf to how often each query term occurs in each
// candidate and s.lengths to the candidates' lengths in terms, and
// returns their average length (at least 1).
func (l *Lexical) countTerms(s *lexicalScratch, chunks []retrieval.Chunk) (avgLen float64) {
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
	return max(float64(total)/float64(n), 1)
}

// setIDF sets s.idf to Lucene's IDF of each query term over the n
// candidates; it stays positive when a term is in all of them.
func (s *lexicalScratch) setIDF(n int) {
	nq := len(s.qterms)
	s.idf = resize(s.idf, nq)
	for j := range nq {
		df := 0
		for i := range n {
			if s.tf[i*nq+j] > 0 {
				df++
			}
		}
		s.idf[j] = math.Log(1 + (float64(n)-float64(df)+0.5)/(float64(df)+0.5))
	}
}

// scoreBM25 sets s.s to each candidate's BM25 score and returns the
// greatest.
func (l *Lexical) scoreBM25(s *lexicalScratch, chunks []retrieval.Chunk, avgLen float64) (lexMax float64) {
	nq, idf := len(s.qterms), s.idf
	s.s = s.s[:0]
	for i := range chunks {
		norm := l.k1 * (1 - l.b + l.b*float64(s.lengths[i])/avgLen)
		var bm float64
		for j := range nq {
			if tf := float64(s.tf[i*nq+j]); tf > 0 {
				bm += idf[j] * tf * (l.k1 + 1) / (tf + norm)
			}
		}
		s.s = append(s.s, scored{idx: i, score: bm})
		lexMax = max(lexMax, bm)
	}
	return lexMax
}

// fuse turns each candidate's BM25 score in s into its fused score,
// Weight*bm25' + (1-Weight)*retrieval'. BM25 is never negative and most
// candidate sets have a chunk without any query term, so it is scaled by
// its maximum alone.
func (l *Lexical) fuse(s []scored, chunks []retrieval.Chunk, lexMax float64) {
	var lexScale float64
	if lexMax > 0 {
		lexScale = l.weight / lexMax
	}
	retScale, retOffset := l.retrievalScale(chunks)
	for i := range s {
		s[i].score = lexScale*s[i].score + retScale*(chunks[i].Score-retOffset)
	}
}

// retrievalScale returns the scale and offset that take the candidates'
// retrieval scores to [0, 1-Weight]. Non-negative scores (retrieval's are in
// [0, 1]) are divided by their maximum, which keeps their ratios: min-max
// would give the last candidate 0 even if it trailed the first by a hair.
// Scores that go negative need min-max.
func (l *Lexical) retrievalScale(chunks []retrieval.Chunk) (scale, offset float64) {
	retMin, retMax := math.Inf(1), math.Inf(-1)
	for _, c := range chunks {
		retMin, retMax = min(retMin, c.Score), max(retMax, c.Score)
	}
	switch {
	case retMin >= 0 && retMax > 0:
		return (1 - l.weight) / retMax, 0
	case retMin < 0 && retMax > retMin:
		return (1 - l.weight) / (retMax - retMin), retMin
	}
	return 0, 0
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
