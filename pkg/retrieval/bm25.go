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

// bm25Weight is a term's BM25 contribution to a chunk of length dl in
// which it occurs tf times, given its idf and the average chunk length.
func bm25Weight(o BM25Options, idf, tf, dl, avgLen float64) float64 {
	return idf * tf * (o.K1 + 1) / (tf + o.K1*(1-o.B+o.B*dl/max(avgLen, 1)))
}

// bm25IDF is Lucene's IDF, which unlike the original cannot go negative
// for terms in more than half of the chunks.
func bm25IDF(n, df float64) float64 {
	return math.Log(1 + (n-df+0.5)/(df+0.5))
}
