package retrieval

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"slices"
)

// pinned is one version of a kb, searched with vector weight w.
type pinned struct {
	kb *KB
	w  float64
}

func (p pinned) Version() int64 { return p.kb.version }

func (p pinned) Retrieve(ctx context.Context, q Query) (Result, error) {
	if q.KB != p.kb.name {
		return Result{}, fmt.Errorf("retrieve from %s: pinned to kb %s", q.KB, p.kb.name)
	}
	return p.kb.search(ctx, q, p.w)
}

// scoreScratch is per-query working memory, pooled per kb because its
// size follows the kb's size.
type scoreScratch struct {
	tok   Tokenizer
	terms [][]byte
	lists [][]posting
	bm    []float32
	cos   []float32
	top   []hit
}

type hit struct {
	score float64
	slot  int32
}

// search scores every chunk of kb for q by BM25 and by cosine similarity
// to the query vector, fuses the two with vector weight w and returns the
// q.K best. The search is exact, not approximate: a linear scan of a few
// thousand, or tens of thousands, of vectors costs well under the latency
// budget and has perfect recall.
//
// Fusion is a weighted sum of min-max normalised scores, not reciprocal
// rank fusion. Because every chunk is scored, the min and max span the
// whole kb and the normalisation is stable; and unlike RRF it keeps the
// size of the gaps, so a chunk that is far ahead on one signal (say the
// only one containing a rare error code) is not pulled level with the
// runner-up. Scores are in [0, 1]; they compare within one query only.
func (kb *KB) search(ctx context.Context, q Query, w float64) (Result, error) {
	useVec, err := kb.checkQuery(ctx, q)
	if err != nil {
		return Result{}, err
	}
	res := Result{KB: kb.name, KBVersion: kb.version, Chunks: []Chunk{}}
	ix := kb.ix
	if ix.chunks == 0 { // every document deleted: nothing to find
		return res, nil
	}

	s := kb.scratch.Get().(*scoreScratch)
	defer kb.scratch.Put(s)

	s.lookUpTerms(ix, q.Text)
	lexical := len(s.lists) > 0
	if !lexical && !useVec {
		return res, nil
	}
	f := fusion{bm: s.scoreBM25(ix, kb.bm)}
	if useVec {
		f.cos = s.scoreCosine(ix, q.Vector)
	}
	f.scale(ix, w, lexical)
	s.top = ix.topK(f, min(q.K, ix.chunks), s.top[:0])
	res.Chunks = ix.hitChunks(s.top)
	return res, nil
}

// checkQuery rejects a query that cannot be answered and reports whether
// its vector takes part: an all-zero vector has no direction to compare.
func (kb *KB) checkQuery(ctx context.Context, q Query) (useVec bool, err error) {
	if q.K <= 0 {
		return false, fmt.Errorf("retrieve from %s: k must be positive, got %d", q.KB, q.K)
	}
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("retrieve from %s: %w", q.KB, err)
	}
	if len(q.Vector) == 0 {
		return false, nil
	}
	if ix := kb.ix; ix.chunks > 0 && len(q.Vector) != ix.dims {
		return false, fmt.Errorf("retrieve from %s: query vector has %d dimensions, kb was embedded with %d by %s",
			q.KB, len(q.Vector), ix.dims, kb.model)
	}
	nonZero, finite := inspect(q.Vector)
	if !finite {
		return false, fmt.Errorf("retrieve from %s: query vector holds NaN or infinity", q.KB)
	}
	return nonZero, nil
}

// lookUpTerms sets s.terms to the distinct terms of text that the index
// holds and s.lists to their postings lists.
func (s *scoreScratch) lookUpTerms(ix *index, text string) {
	s.terms, s.lists = s.terms[:0], s.lists[:0]
	for _, t := range s.tok.Terms(text) {
		if slices.ContainsFunc(s.terms, func(u []byte) bool { return bytes.Equal(t, u) }) {
			continue
		}
		if ps, ok := ix.terms.getBytes(t); ok {
			s.terms = append(s.terms, t)
			s.lists = append(s.lists, ps)
		}
	}
}

// scoreBM25 returns every slot's BM25 score for the terms of s.lists.
// Scores are indexed by slot; free slots score nothing.
func (s *scoreScratch) scoreBM25(ix *index, o BM25Options) []float32 {
	s.bm = resize(s.bm, len(ix.pages)*pageSlots)
	bm := s.bm
	clear(bm)
	n := float64(ix.chunks)
	avgLen := float64(ix.length) / n
	for _, ps := range s.lists {
		idf := bm25IDF(n, float64(len(ps)))
		for _, p := range ps {
			pg, j := ix.at(p.slot)
			bm[p.slot] += float32(bm25Weight(o, idf, float64(p.tf), float64(pg.length[j]), avgLen))
		}
	}
	return bm
}

// scoreCosine returns every live slot's inner product with the query
// vector, indexed by slot. The query vector is not normalised: every
// cosine would be divided by the same |q|, which min-max normalisation
// cancels anyway.
func (s *scoreScratch) scoreCosine(ix *index, vec []float32) []float32 {
	s.cos = resize(s.cos, len(ix.pages)*pageSlots)
	cos := s.cos
	for p, pg := range ix.pages {
		dotPage(vec, pg, cos[p*pageSlots:(p+1)*pageSlots])
	}
	return cos
}

// fusion turns a slot's BM25 and cosine scores into its fused score
//
//	wv*(cos-minC)/(maxC-minC) + (1-wv)*(bm-minB)/(maxB-minB)
//
// where wv is the vector weight, with a constant signal contributing
// nothing. cos is nil when the query has no usable vector.
type fusion struct {
	bm, cos        []float32
	minB, minC     float32
	scaleB, scaleC float64
}

// scale sets the minima and scales of f over the live slots. A signal the
// query lacks leaves the whole weight to the other one, whatever w says.
func (f *fusion) scale(ix *index, w float64, lexical bool) {
	minB, maxB := ix.minMax(f.bm)
	var minC, maxC float32
	if f.cos != nil {
		minC, maxC = ix.minMax(f.cos)
	}
	wv := w
	switch {
	case f.cos == nil:
		wv = 0
	case !lexical:
		wv = 1
	}
	f.minB, f.minC, f.scaleB, f.scaleC = minB, minC, 0, 0
	if maxC > minC {
		f.scaleC = wv / float64(maxC-minC)
	}
	if maxB > minB {
		f.scaleB = (1 - wv) / float64(maxB-minB)
	}
}

// topK fuses the scores of every live slot and returns the k best hits,
// best first, in top's storage. The fields of f are copied to locals
// because the loop visits every slot of the kb: the compiler keeps a
// struct of more than four fields in memory, and read through f each
// field would be loaded again on every iteration.
func (ix *index) topK(f fusion, k int, top []hit) []hit {
	bm, cos, minB, minC, scaleB, scaleC := f.bm, f.cos, f.minB, f.minC, f.scaleB, f.scaleC
	useVec := cos != nil
	worse := ix.worse
	for p, pg := range ix.pages {
		for j := range pageSlots {
			if !pg.live[j] {
				continue
			}
			i := p*pageSlots + j
			score := scaleB * float64(bm[i]-minB)
			if useVec {
				score += scaleC * float64(cos[i]-minC)
			} else if bm[i] == 0 {
				continue // lexical only: a chunk without any query term is no answer
			}
			if len(top) == k && score < top[0].score {
				continue // the common case, decided without a call
			}
			top = pushTop(top, k, hit{score, int32(i)}, worse)
		}
	}
	sortHits(top, worse)
	return top
}

// hitChunks returns the chunks of hits, in order, with their scores.
func (ix *index) hitChunks(hits []hit) []Chunk {
	out := make([]Chunk, len(hits))
	for i, t := range hits {
		pg, j := ix.at(t.slot)
		out[i] = pg.chunks[j]
		out[i].Score = t.score
	}
	return out
}

// worse orders hits: lower score first, and among equal scores the one
// that ranks later (see index.before).
func (ix *index) worse(a, b hit) bool {
	if a.score != b.score {
		return a.score < b.score
	}
	return a.slot != b.slot && ix.before(b.slot, a.slot)
}

// pushTop keeps the k best hits in a min-heap whose root is the worst of
// them: O(n log k) with no allocation once top has grown to k.
func pushTop(top []hit, k int, h hit, worse func(a, b hit) bool) []hit {
	if len(top) < k {
		top = append(top, h)
		for i := len(top) - 1; i > 0; {
			parent := (i - 1) / 2
			if !worse(top[i], top[parent]) {
				break
			}
			top[i], top[parent] = top[parent], top[i]
			i = parent
		}
		return top
	}
	if !worse(top[0], h) {
		return top
	}
	top[0] = h
	for i := 0; ; {
		l, r, least := 2*i+1, 2*i+2, i
		if l < len(top) && worse(top[l], top[least]) {
			least = l
		}
		if r < len(top) && worse(top[r], top[least]) {
			least = r
		}
		if least == i {
			return top
		}
		top[i], top[least] = top[least], top[i]
		i = least
	}
}

// sortHits orders hits best first.
func sortHits(hits []hit, worse func(a, b hit) bool) {
	slices.SortFunc(hits, func(a, b hit) int {
		switch {
		case worse(b, a):
			return -1
		case worse(a, b):
			return 1
		}
		return 0
	})
}

func resize(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// minMax returns the least and greatest of the live slots' scores.
func (ix *index) minMax(xs []float32) (lo, hi float32) {
	first := true
	for p, pg := range ix.pages {
		for j, x := range xs[p*pageSlots : (p+1)*pageSlots] {
			switch {
			case !pg.live[j]:
			case first:
				lo, hi, first = x, x, false
			default:
				lo = min(lo, x)
				hi = max(hi, x)
			}
		}
	}
	return lo, hi
}

// inspect reports whether v has a non-zero element and whether all its
// elements are finite.
func inspect(v []float32) (nonZero, finite bool) {
	for _, x := range v {
		f := float64(x)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nonZero, false
		}
		nonZero = nonZero || x != 0
	}
	return nonZero, true
}

// dotPage sets out[j] to the inner product of q and the vector of slot j
// of the page, for its live slots (others are left as they are).
func dotPage(q []float32, pg *page, out []float32) {
	d := len(q)
	for j := range out[:pageSlots] {
		if pg.live[j] {
			out[j] = dot(q, pg.vecs[j*d:(j+1)*d])
		}
	}
}

// dot is the inner product of two vectors of equal length, with four
// independent sums so that the additions pipeline instead of waiting on
// each other. Unrolling further, or taking four vectors at a time to load
// each element of a once, measured no faster at 256 dimensions on 10k
// chunks or more: the scan is then bound by memory bandwidth, not by
// arithmetic.
func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		a4, b4 := a[i:i+4:i+4], b[i:i+4:i+4]
		s0 += a4[0] * b4[0]
		s1 += a4[1] * b4[1]
		s2 += a4[2] * b4[2]
		s3 += a4[3] * b4[3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return s0 + s1 + s2 + s3
}
