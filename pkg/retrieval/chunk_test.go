package retrieval

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// numbered returns sentences of the given word count whose words are
// numbered W0, W1, ... across the whole text, so that order and overlap
// can be checked. Capitals make every "." a sentence end.
func numbered(next *int, sentences, words int) string {
	var b strings.Builder
	for s := range sentences {
		if s > 0 {
			b.WriteByte(' ')
		}
		for w := range words {
			if w > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "W%d", *next)
			*next++
		}
		b.WriteByte('.')
	}
	return b.String()
}

func wordNumbers(t *testing.T, chunk string) []int {
	t.Helper()
	var out []int
	for _, f := range strings.Fields(chunk) {
		var n int
		if _, err := fmt.Sscanf(strings.TrimSuffix(f, "."), "W%d", &n); err != nil {
			t.Fatalf("unexpected word %q in chunk %q", f, chunk)
		}
		out = append(out, n)
	}
	return out
}

func TestSplitLimitsAndOverlap(t *testing.T) {
	next := 0
	text := numbered(&next, 12, 7) // one paragraph of 84 words
	opts := ChunkOptions{MaxWords: 20, OverlapWords: 8}
	chunks := Split(text, opts)
	if len(chunks) < 5 {
		t.Fatalf("got %d chunks for 84 words at 20 per chunk: %q", len(chunks), chunks)
	}
	covered := -1
	for i, c := range chunks {
		nums := wordNumbers(t, c)
		if len(nums) > opts.MaxWords {
			t.Errorf("chunk %d has %d words, max %d", i, len(nums), opts.MaxWords)
		}
		for j := 1; j < len(nums); j++ {
			if nums[j] != nums[j-1]+1 {
				t.Fatalf("chunk %d is not contiguous: %v", i, nums)
			}
		}
		if nums[0] > covered+1 {
			t.Fatalf("chunk %d starts at w%d, leaving a gap after w%d", i, nums[0], covered)
		}
		if i > 0 {
			// Whole 7-word sentences fit the 8-word overlap: exactly one.
			if overlap := covered - nums[0] + 1; overlap != 7 {
				t.Errorf("chunks %d and %d overlap by %d words, want one 7-word sentence", i-1, i, overlap)
			}
			if nums[0]%7 != 0 {
				t.Errorf("chunk %d starts mid-sentence at w%d", i, nums[0])
			}
		}
		covered = nums[len(nums)-1]
	}
	if covered != next-1 {
		t.Errorf("chunks end at w%d, text ends at w%d", covered, next-1)
	}
}

func TestSplitLongSentenceIntoOverlappingWindows(t *testing.T) {
	next := 0
	text := numbered(&next, 1, 50)
	chunks := Split(text, ChunkOptions{MaxWords: 20, OverlapWords: 5})
	want := [][2]int{{0, 19}, {15, 34}, {30, 49}}
	if len(chunks) != len(want) {
		t.Fatalf("got %d chunks, want %d: %q", len(chunks), len(want), chunks)
	}
	for i, c := range chunks {
		nums := wordNumbers(t, c)
		if nums[0] != want[i][0] || nums[len(nums)-1] != want[i][1] {
			t.Errorf("chunk %d spans w%d-w%d, want w%d-w%d", i, nums[0], nums[len(nums)-1], want[i][0], want[i][1])
		}
	}
}

func TestSplitOverlapCutsLongSentence(t *testing.T) {
	next := 0
	text := numbered(&next, 3, 12) // sentences longer than the overlap
	chunks := Split(text, ChunkOptions{MaxWords: 25, OverlapWords: 5})
	if len(chunks) != 2 {
		t.Fatalf("got %d chunks: %q", len(chunks), chunks)
	}
	if nums := wordNumbers(t, chunks[1]); nums[0] != 19 || len(nums) != 17 {
		t.Errorf("second chunk = w%d.. (%d words), want the last 5 words of sentence 2 and all of sentence 3", nums[0], len(nums))
	}
}

func TestSplitKeepsParagraphsWhole(t *testing.T) {
	next := 0
	p1 := numbered(&next, 2, 6) // 12 words
	p2 := numbered(&next, 3, 5) // 15 words
	p3 := numbered(&next, 1, 4) // 4 words
	text := p1 + "\n\n" + p2 + "\n\n" + p3
	chunks := Split(text, ChunkOptions{MaxWords: 20, OverlapWords: 5})
	// p2 does not fit after p1, but fits alone: break before it, with no
	// overlap from p1. p3 fits after p2.
	want := []string{p1, p2 + "\n\n" + p3}
	if len(chunks) != len(want) {
		t.Fatalf("got %q, want %q", chunks, want)
	}
	for i := range want {
		if chunks[i] != want[i] {
			t.Errorf("chunk %d = %q, want %q", i, chunks[i], want[i])
		}
	}
}

func TestSplitSentenceBoundaries(t *testing.T) {
	text := `Queues grow, e.g. under load. Latency is 0.5 s at P50! Is it "fast?" Yes (mostly.) Done`
	got := sentencesOf(text)
	want := []string{"Queues grow, e.g. under load.", "Latency is 0.5 s at P50!", `Is it "fast?"`, "Yes (mostly.)", "Done"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("sentencesOf = %q, want %q", got, want)
	}
}

func TestSplitMarkdownLinesStandAlone(t *testing.T) {
	text := "## Limits\n- requests per minute\n- tokens per minute\nBoth apply.\n\n1. first\n2. second"
	chunks := Split(text, ChunkOptions{MaxWords: 50})
	want := "## Limits\n- requests per minute\n- tokens per minute\nBoth apply.\n\n1. first\n2. second"
	if len(chunks) != 1 || chunks[0] != want {
		t.Errorf("Split = %q, want [%q]", chunks, want)
	}
}

func TestSplitEmpty(t *testing.T) {
	if got := Split(" \n\n \t", ChunkOptions{}); len(got) != 0 {
		t.Errorf("Split of white space = %q", got)
	}
}

func TestTokenizer(t *testing.T) {
	var tok Tokenizer
	got := tok.Terms("How does the Token-Bucket refill? P99 = 1.5s; ÉTÉ straße")
	var s []string
	for _, term := range got {
		s = append(s, string(term))
	}
	want := "token bucket refill p99 1 5s été straße"
	if strings.Join(s, " ") != want {
		t.Errorf("Terms = %q, want %q", strings.Join(s, " "), want)
	}
	text := "Weighted fair queuing shares a resource between Tenants in proportion to their weights."
	tok.Terms(text)
	if n := testing.AllocsPerRun(100, func() { tok.Terms(text) }); n != 0 {
		t.Errorf("a warm Tokenizer allocates %v times per call", n)
	}
}

// Whatever the mix of paragraph and sentence lengths, chunks respect the
// limit, are contiguous runs of the text and leave nothing out.
func TestSplitProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		next := 0
		var paras []string
		for range 1 + rng.IntN(5) {
			var sents []string
			for range 1 + rng.IntN(6) {
				sents = append(sents, numbered(&next, 1, 1+rng.IntN(40)))
			}
			paras = append(paras, strings.Join(sents, " "))
		}
		opts := ChunkOptions{MaxWords: 5 + rng.IntN(40), OverlapWords: rng.IntN(15) - 1}
		chunks := Split(strings.Join(paras, "\n\n"), opts)
		o := opts.withDefaults()
		covered := -1
		for i, c := range chunks {
			nums := wordNumbers(t, c)
			if len(nums) > o.MaxWords {
				t.Fatalf("trial %d %+v: chunk %d has %d words", trial, o, i, len(nums))
			}
			for j := 1; j < len(nums); j++ {
				if nums[j] != nums[j-1]+1 {
					t.Fatalf("trial %d %+v: chunk %d is not contiguous: %v", trial, o, i, nums)
				}
			}
			if nums[0] > covered+1 || nums[len(nums)-1] <= covered {
				t.Fatalf("trial %d %+v: chunk %d spans W%d-W%d after W%d", trial, o, i, nums[0], nums[len(nums)-1], covered)
			}
			if covered-nums[0]+1 > o.OverlapWords {
				t.Fatalf("trial %d %+v: chunk %d overlaps by %d words", trial, o, i, covered-nums[0]+1)
			}
			covered = nums[len(nums)-1]
		}
		if covered != next-1 {
			t.Fatalf("trial %d %+v: chunks end at W%d, text at W%d", trial, o, covered, next-1)
		}
	}
}
