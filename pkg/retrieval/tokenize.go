package retrieval

import (
	"unicode"
	"unicode/utf8"
)

// Tokenizer splits text into BM25 terms: lower-cased maximal runs of
// letters and digits, without English stop words. It reuses its buffers,
// so one Tokenizer serves one goroutine, and the terms it returns are only
// valid until its next call. The zero value is ready to use.
//
// It deliberately does not share code with the local embedder's word
// splitter: that one is frozen by the embedder's model version, this one
// may change with the index.
type Tokenizer struct {
	lower []byte
	terms [][]byte
}

// Terms returns the terms of text in order, repeats included.
func (t *Tokenizer) Terms(text string) [][]byte {
	lower := t.lower[:0]
	terms := t.terms[:0]
	start := -1 // start of the current word in lower, or -1
	end := func() {
		if w := lower[start:]; IsStopWord(w) {
			lower = lower[:start]
		} else {
			terms = append(terms, w)
		}
		start = -1
	}
	for i := 0; i < len(text); {
		c := text[i]
		if c < utf8.RuneSelf {
			if j := i + lowerRun(text[i:]); j > i {
				// The common case: copy a run of lower-case letters and
				// digits at once.
				if start < 0 {
					start = len(lower)
				}
				lower = append(lower, text[i:j]...)
				i = j
				continue
			}
			i++
			if 'A' <= c && c <= 'Z' {
				if start < 0 {
					start = len(lower)
				}
				lower = append(lower, c+'a'-'A')
			} else if start >= 0 {
				end()
			}
			continue
		}
		r, n := utf8.DecodeRuneInString(text[i:])
		i += n
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			if start < 0 {
				start = len(lower)
			}
			lower = utf8.AppendRune(lower, unicode.ToLower(r))
		} else if start >= 0 {
			end()
		}
	}
	if start >= 0 {
		end()
	}
	// Terms are subslices of lower. If lower grew (and moved) while they
	// were collected, the earlier ones still point into the old array,
	// which nothing writes to any more, so they stay correct.
	t.lower, t.terms = lower, terms
	return terms
}

// lowerRun returns the length of the run of ASCII lower-case letters and
// digits at the start of s.
func lowerRun(s string) int {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return i
		}
	}
	return len(s)
}

// IsStopWord reports whether a lower-cased term is a function word that
// BM25 ignores.
func IsStopWord(term []byte) bool {
	switch string(term) {
	case "a", "about", "an", "and", "are", "as", "at", "be", "but", "by", "can",
		"could", "did", "do", "does", "for", "from", "had", "has", "have", "how",
		"i", "if", "in", "into", "is", "it", "its", "me", "my", "no", "not", "of",
		"on", "or", "our", "should", "so", "than", "that", "the", "their", "them",
		"then", "there", "these", "they", "this", "those", "to", "too", "us",
		"was", "we", "were", "what", "when", "where", "which", "while", "who",
		"why", "will", "with", "would", "you", "your":
		return true
	}
	return false
}
