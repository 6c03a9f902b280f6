package retrieval

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ChunkOptions bounds chunks. Sizes are in words (runs of non-space), which
// are cheap to count and close enough to tokens for budgeting: English
// prose runs about 1.3 tokens per word.
type ChunkOptions struct {
	// MaxWords bounds a chunk. Default 90, about 120 tokens.
	MaxWords int
	// OverlapWords is how much of the end of a chunk is repeated at the
	// start of the next when the break falls inside a paragraph, so that a
	// fact stated across the break is whole in one of them. Whole sentences
	// are carried when they fit, otherwise the last OverlapWords words;
	// less when the next sentence would not fit beside them. Chunks that
	// start a paragraph carry nothing. Default 20; negative means none.
	OverlapWords int
}

// ChunkingFor is the chunking for chunks of about chunkTokens tokens that
// overlap by about overlapTokens (0: not at all), as retrieval.chunk_tokens
// and retrieval.chunk_overlap_tokens configure them: sizes are counted in
// words, at the ~1.3 tokens a word of English prose.
func ChunkingFor(chunkTokens, overlapTokens int) ChunkOptions {
	overlap := overlapTokens * 3 / 4
	if overlap == 0 {
		overlap = -1 // none
	}
	return ChunkOptions{MaxWords: max(chunkTokens*3/4, 10), OverlapWords: overlap}
}

// String describes the effective options ("words=90/20"), for naming what
// a chunking produced.
func (o ChunkOptions) String() string {
	o = o.withDefaults()
	return fmt.Sprintf("words=%d/%d", o.MaxWords, o.OverlapWords)
}

func (o ChunkOptions) withDefaults() ChunkOptions {
	if o.MaxWords <= 0 {
		o.MaxWords = 90
	}
	if o.OverlapWords == 0 {
		o.OverlapWords = 20
	}
	if o.OverlapWords < 0 {
		o.OverlapWords = 0
	}
	if o.OverlapWords >= o.MaxWords {
		o.OverlapWords = o.MaxWords / 2
	}
	return o
}

// sentence is a unit of packing: a sentence, a heading or a list item.
type sentence struct {
	words []string
	// sep goes before the sentence when it follows another in a chunk:
	// "\n\n" at a paragraph start, "\n" at a line start, " " otherwise.
	sep  string
	para int // paragraph number
	// window marks the second and later windows of a sentence longer than
	// MaxWords, which overlap their predecessor already.
	window bool
}

// piece is a sentence, or its tail from word from on, within a chunk.
type piece struct {
	s    int
	from int
}

// Split cuts text into chunks of at most MaxWords words. It keeps
// paragraphs whole when they fit in a chunk and otherwise breaks between
// sentences; only a sentence longer than MaxWords is cut inside, into
// overlapping windows. A chunk that continues a paragraph overlaps its
// predecessor (see OverlapWords).
func Split(text string, opts ChunkOptions) []string {
	opts = opts.withDefaults()
	sents := splitSentences(text, opts)
	if len(sents) == 0 {
		return nil
	}
	paraWords := make([]int, sents[len(sents)-1].para+1)
	for _, s := range sents {
		paraWords[s.para] += len(s.words)
	}

	var chunks []string
	var cur []piece
	curWords := 0
	words := func(p piece) int { return len(sents[p.s].words) - p.from }
	emit := func() {
		var b strings.Builder
		for i, p := range cur {
			if i > 0 {
				b.WriteString(sents[p.s].sep)
			}
			b.WriteString(strings.Join(sents[p.s].words[p.from:], " "))
		}
		chunks = append(chunks, b.String())
	}
	// startAfter begins a new chunk with the overlap from cur that leaves
	// room for a sentence of need words.
	startAfter := func(need int) {
		room := min(opts.OverlapWords, opts.MaxWords-need)
		var tail []piece
		tailWords := 0
		for i := len(cur) - 1; i >= 0 && room > 0; i-- {
			w := words(cur[i])
			if tailWords+w > room {
				if len(tail) == 0 {
					// Not even the last sentence fits: carry its last words.
					p := cur[i]
					p.from = len(sents[p.s].words) - room
					tail, tailWords = []piece{p}, room
				}
				break
			}
			tail = append([]piece{cur[i]}, tail...)
			tailWords += w
		}
		cur, curWords = tail, tailWords
	}

	lastPara := -1
	for i, s := range sents {
		n := len(s.words)
		full := curWords+n > opts.MaxWords
		// At a paragraph start, break early if the paragraph would not fit
		// here but fits a chunk of its own.
		if s.para != lastPara && len(cur) > 0 {
			if p := paraWords[s.para]; curWords+p > opts.MaxWords && p <= opts.MaxWords {
				full = true
			}
		}
		lastPara = s.para
		if full && len(cur) > 0 {
			emit()
			if s.sep == "\n\n" || s.window {
				// A paragraph break is a natural boundary: facts rarely
				// straddle it, and a fragment of the previous paragraph
				// would only dilute the new chunk. A window of a long
				// sentence brings its own overlap.
				cur, curWords = cur[:0], 0
			} else {
				startAfter(n)
			}
		}
		cur = append(cur, piece{s: i})
		curWords += n
	}
	if curWords > 0 {
		emit()
	}
	return chunks
}

// splitSentences splits text into paragraphs (at blank lines), lines that
// stand alone (headings and list items) and sentences, and cuts sentences
// longer than MaxWords into overlapping windows.
func splitSentences(text string, opts ChunkOptions) []sentence {
	var out []sentence
	add := func(words []string, sep string, para int) {
		if len(words) == 0 {
			return
		}
		if len(words) <= opts.MaxWords {
			out = append(out, sentence{words: words, sep: sep, para: para})
			return
		}
		step := opts.MaxWords - opts.OverlapWords
		for from := 0; ; from += step {
			to := min(from+opts.MaxWords, len(words))
			out = append(out, sentence{words: words[from:to], sep: sep, para: para, window: from > 0})
			sep = " "
			if to == len(words) {
				return
			}
		}
	}
	para := 0
	for _, block := range splitParagraphs(text) {
		sep := "\n\n"
		var prose []string
		flushProse := func() {
			for _, s := range sentencesOf(strings.Join(prose, " ")) {
				add(strings.Fields(s), sep, para)
				sep = " "
			}
			prose = prose[:0]
		}
		for _, line := range strings.Split(block, "\n") {
			line = strings.TrimSpace(line)
			if standsAlone(line) {
				flushProse()
				add(strings.Fields(line), sep, para)
				sep = "\n"
				continue
			}
			prose = append(prose, line)
		}
		flushProse()
		para++
	}
	return out
}

func splitParagraphs(text string) []string {
	text = strings.ReplaceAll(text, "\r\n", "\n")
	var paras []string
	var cur []string
	for _, line := range strings.Split(text, "\n") {
		if strings.TrimSpace(line) == "" {
			if len(cur) > 0 {
				paras = append(paras, strings.Join(cur, "\n"))
				cur = nil
			}
			continue
		}
		cur = append(cur, line)
	}
	if len(cur) > 0 {
		paras = append(paras, strings.Join(cur, "\n"))
	}
	return paras
}

// standsAlone reports whether a line is a markdown heading or list item,
// which keeps its own line instead of flowing into a sentence.
func standsAlone(line string) bool {
	if strings.HasPrefix(line, "#") || strings.HasPrefix(line, "- ") ||
		strings.HasPrefix(line, "* ") || strings.HasPrefix(line, "+ ") {
		return true
	}
	i := 0
	for i < len(line) && '0' <= line[i] && line[i] <= '9' {
		i++
	}
	return i > 0 && i+1 < len(line) && (line[i] == '.' || line[i] == ')') && line[i+1] == ' '
}

// sentencesOf splits prose after '.', '!' or '?' (and any closing quotes
// or brackets) when white space and then something other than a
// lower-case letter follow. "e.g. the" and "0.5 MB" therefore stay whole.
func sentencesOf(prose string) []string {
	var out []string
	start := 0
	for i := 0; i < len(prose); i++ {
		if c := prose[i]; c != '.' && c != '!' && c != '?' {
			continue
		}
		j := i + 1
		for j < len(prose) && strings.IndexByte(`"')]`, prose[j]) >= 0 {
			j++
		}
		if j >= len(prose) || prose[j] != ' ' {
			continue
		}
		k := j
		for k < len(prose) && prose[k] == ' ' {
			k++
		}
		if k == len(prose) {
			continue
		}
		if r, _ := utf8.DecodeRuneInString(prose[k:]); unicode.IsLower(r) {
			continue
		}
		out = append(out, prose[start:j])
		start = k
		i = k - 1
	}
	if s := strings.TrimSpace(prose[start:]); s != "" {
		out = append(out, s)
	}
	return out
}
