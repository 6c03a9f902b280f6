package retrieval

import "math"

// BM25Options are the two BM25 parameters.
type BM25Options struct {
	// K1 is term-frequency saturation. Default 1.2.
	K1 float64
	// B is length normalisation, 0 (none) to 1 (full). Default 0.75; to
	// turn normalisation off use a tiny positive value.
	B float64
}

func (o BM25Options) withDefaults() BM25Options {
	if o.K1 <= 0 {
		o.K1 = 1.2
	}
	if o.B <= 0 {
		o.B = 0.75
	}
	return o
}

// bm25Index is an inverted index whose postings already hold each term's
// complete BM25 contribution to a chunk (IDF times saturated, length-
// normalised tf). The corpus is fixed after load, so nothing is left to
// compute at query time but a sum over the query terms' postings.
type bm25Index struct {
	terms    map[string]int32
	postings [][]posting
}

type posting struct {
	chunk  int32
	weight float32
}

// newBM25Index indexes texts, one per chunk.
func newBM25Index(texts []string, opts BM25Options) bm25Index {
	var tok Tokenizer
	ix := bm25Index{terms: map[string]int32{}}
	type count struct {
		term int32
		tf   int32
	}
	perChunk := make([][]count, len(texts))
	lengths := make([]int, len(texts))
	total := 0
	seen := map[int32]int{} // term -> index into perChunk[i], reset per chunk
	for i, text := range texts {
		terms := tok.Terms(text)
		lengths[i] = len(terms)
		total += len(terms)
		clear(seen)
		for _, t := range terms {
			id, ok := ix.terms[string(t)]
			if !ok {
				id = int32(len(ix.postings))
				ix.terms[string(t)] = id
				ix.postings = append(ix.postings, nil)
			}
			if j, ok := seen[id]; ok {
				perChunk[i][j].tf++
				continue
			}
			seen[id] = len(perChunk[i])
			perChunk[i] = append(perChunk[i], count{id, 1})
		}
	}
	n := float64(len(texts))
	avgLen := float64(total) / max(n, 1)
	df := make([]int, len(ix.postings))
	for _, counts := range perChunk {
		for _, c := range counts {
			df[c.term]++
		}
	}
	for i, counts := range perChunk {
		norm := opts.K1 * (1 - opts.B + opts.B*float64(lengths[i])/max(avgLen, 1))
		for _, c := range counts {
			tf := float64(c.tf)
			w := bm25IDF(n, float64(df[c.term])) * tf * (opts.K1 + 1) / (tf + norm)
			ix.postings[c.term] = append(ix.postings[c.term], posting{int32(i), float32(w)})
		}
	}
	return ix
}

// bm25IDF is Lucene's IDF, which unlike the original cannot go negative
// for terms in more than half of the chunks.
func bm25IDF(n, df float64) float64 {
	return math.Log(1 + (n-df+0.5)/(df+0.5))
}
