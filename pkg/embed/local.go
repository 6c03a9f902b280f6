package embed

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"unicode"
	"unicode/utf8"
)

// localModel is bumped whenever the features, weights or hashing of Local
// change, because cached vectors of the old scheme would no longer match.
const localModel = "local-hash-v1"

// Feature weights. Character trigrams are many per word, so each weighs
// little; together they let "refill" match "refills" and survive typos,
// while unigrams and bigrams carry the exact wording.
const (
	weightUnigram = 1.0
	weightBigram  = 0.6
	weightTrigram = 0.25
)

// LocalOptions configures Local.
type LocalOptions struct {
	// Dims is the vector length. Default 256.
	Dims int
}

// Local is a deterministic embedder that needs no model: it hashes word
// unigrams, word bigrams and character trigrams into Dims signed buckets
// (the "hashing trick"), weights repeated features sublinearly
// (1+ln tf) and L2-normalises the result. It captures lexical and
// sub-word similarity only, not meaning, but it ranks passages that share
// a query's words above unrelated ones, costs microseconds and never
// changes under a fixed Model name. It is safe for concurrent use.
type Local struct {
	dims    int
	model   string
	scratch sync.Pool // *localScratch
}

type localScratch struct {
	lower []byte
	words []span
	feats []feature
}

type span struct{ lo, hi int }

type feature struct {
	h uint64
	w float32
}

// NewLocal returns a Local embedder.
func NewLocal(opts LocalOptions) *Local {
	if opts.Dims <= 0 {
		opts.Dims = 256
	}
	l := &Local{dims: opts.Dims, model: fmt.Sprintf("%s/%d", localModel, opts.Dims)}
	l.scratch.New = func() any { return new(localScratch) }
	return l
}

// Model returns "local-hash-v1/<dims>".
func (l *Local) Model() string { return l.model }

// Dims returns the vector length.
func (l *Local) Dims() int { return l.dims }

// Embed embeds each text. The vectors share one backing array.
func (l *Local) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("embed %d texts: %w", len(texts), err)
	}
	backing := make([]float32, len(texts)*l.dims)
	out := make([][]float32, len(texts))
	s := l.scratch.Get().(*localScratch)
	defer l.scratch.Put(s)
	for i, t := range texts {
		v := backing[i*l.dims : (i+1)*l.dims : (i+1)*l.dims]
		l.embedInto(v, t, s)
		out[i] = v
	}
	return out, nil
}

// embedInto writes the embedding of text into v, which must be zeroed and
// of length l.dims.
func (l *Local) embedInto(v []float32, text string, s *localScratch) {
	s.lower, s.words = splitWords(s.lower[:0], s.words[:0], text)
	feats := s.feats[:0]
	var prev []byte
	for _, w := range s.words {
		word := s.lower[w.lo:w.hi]
		if isStopWord(word) {
			// Bigrams join the words around a stop word: "rate of limiting"
			// and "rate limiting" should look alike.
			continue
		}
		feats = append(feats, feature{fnv(fnvByte(fnvOffset, 'u'), word), weightUnigram})
		if prev != nil {
			h := fnv(fnvByte(fnvOffset, 'b'), prev)
			h = fnv(fnvByte(h, ' '), word)
			feats = append(feats, feature{h, weightBigram})
		}
		prev = word
		// Trigrams of "<word>", so that prefixes and suffixes are marked.
		for i := -1; i+2 <= len(word); i++ {
			h := fnvByte(fnvOffset, 'c')
			for j := i; j < i+3; j++ {
				switch {
				case j < 0:
					h = fnvByte(h, '<')
				case j >= len(word):
					h = fnvByte(h, '>')
				default:
					h = fnvByte(h, word[j])
				}
			}
			feats = append(feats, feature{h, weightTrigram})
		}
	}
	s.feats = feats
	if len(feats) == 0 {
		return
	}
	slices.SortFunc(feats, func(a, b feature) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return 0
	})
	dims := uint64(l.dims)
	for i := 0; i < len(feats); {
		j := i + 1
		for j < len(feats) && feats[j].h == feats[i].h {
			j++
		}
		weight := feats[i].w
		if n := j - i; n > 1 {
			weight *= 1 + float32(math.Log(float64(n)))
		}
		h := mix(feats[i].h)
		if h>>63 == 1 {
			weight = -weight
		}
		v[h%dims] += weight
		i = j
	}
	Normalize(v)
}

// Normalize scales v to unit length in place, so that cosine similarity is
// a dot product. A zero vector stays zero.
func Normalize(v []float32) {
	var sum float64
	for _, x := range v {
		sum += float64(x) * float64(x)
	}
	if sum == 0 {
		return
	}
	inv := float32(1 / math.Sqrt(sum))
	for i := range v {
		v[i] *= inv
	}
}

// splitWords appends the lower-cased text to lower and the spans of its
// words (maximal runs of letters and digits) to words.
func splitWords(lower []byte, words []span, text string) ([]byte, []span) {
	start := -1
	for i := 0; i < len(text); {
		c := text[i]
		var r rune
		n := 1
		if c < utf8.RuneSelf {
			r = rune(c)
		} else {
			r, n = utf8.DecodeRuneInString(text[i:])
		}
		i += n
		isWord := ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') || ('A' <= r && r <= 'Z') ||
			(r >= utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r)))
		if !isWord {
			if start >= 0 {
				words = append(words, span{start, len(lower)})
				start = -1
			}
			continue
		}
		if start < 0 {
			start = len(lower)
		}
		switch {
		case 'A' <= r && r <= 'Z':
			lower = append(lower, byte(r)+'a'-'A')
		case r < utf8.RuneSelf:
			lower = append(lower, byte(r))
		default:
			lower = utf8.AppendRune(lower, unicode.ToLower(r))
		}
	}
	if start >= 0 {
		words = append(words, span{start, len(lower)})
	}
	return lower, words
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnv continues a 64-bit FNV-1a hash over b.
func fnv(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= fnvPrime
	}
	return h
}

func fnvByte(h uint64, c byte) uint64 {
	h ^= uint64(c)
	return h * fnvPrime
}

// mix is MurmurHash3's 64-bit finaliser. FNV's low bits, used for the
// bucket, and its top bit, used for the sign, are poorly mixed on their own.
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// isStopWord reports whether w is one of the function words that carry no
// topic. The list is part of the local-hash model: changing it changes
// every vector and therefore requires a new localModel name.
func isStopWord(w []byte) bool {
	switch string(w) {
	case "a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "does",
		"for", "from", "has", "have", "how", "i", "if", "in", "into", "is", "it",
		"its", "my", "of", "on", "or", "our", "so", "that", "the", "their",
		"then", "there", "these", "this", "to", "was", "we", "were", "what",
		"when", "where", "which", "who", "why", "will", "with", "you", "your":
		return true
	}
	return false
}
