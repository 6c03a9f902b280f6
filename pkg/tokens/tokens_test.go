package tokens

import (
	"sync"
	"testing"
)

func TestCountKnownStrings(t *testing.T) {
	cases := []struct {
		enc, text string
		want      int
	}{
		// Reference counts from OpenAI's tiktoken.
		{CL100K, "hello world", 2},
		{CL100K, "tiktoken is great!", 6},
		{O200K, "hello world", 2},
		{CL100K, "", 0},
		{CL100K, "<|endoftext|>", 7},
	}
	for _, tc := range cases {
		c, err := For(tc.enc)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Count(tc.text); got != tc.want {
			t.Errorf("%s Count(%q) = %d, want %d", tc.enc, tc.text, got, tc.want)
		}
	}
}

func TestForSharesCounter(t *testing.T) {
	a, err := For(CL100K)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := For(CL100K)
	if a != b {
		t.Fatal("For returned two counters for one encoding")
	}
	if _, err := For("gpt2-bogus"); err == nil {
		t.Fatal("unknown encoding accepted")
	}
}

func TestCountConcurrent(t *testing.T) {
	c, err := For(CL100K)
	if err != nil {
		t.Fatal(err)
	}
	want := c.Count("The quick brown fox jumps over the lazy dog.")
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				if got := c.Count("The quick brown fox jumps over the lazy dog."); got != want {
					t.Errorf("concurrent count %d, want %d", got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestCountChat(t *testing.T) {
	c, _ := For(CL100K)
	got := c.CountChat([]Message{{Role: "system", Content: "hi"}, {Role: "user", Content: "hello world"}})
	want := 3 + (3 + 1 + 1) + (3 + 1 + 2)
	if got != want {
		t.Fatalf("CountChat = %d, want %d", got, want)
	}
}

func BenchmarkCount(b *testing.B) {
	c, _ := For(CL100K)
	text := "Sluice keeps RAG and LLM chat services standing under load with token-based rate limits and a fair queue."
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		c.Count(text)
	}
}
