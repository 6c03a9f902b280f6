package embed

import (
	"context"
	"math"
	"testing"
)

func embedOne(t testing.TB, e Embedder, text string) []float32 {
	t.Helper()
	vecs, err := e.Embed(context.Background(), []string{text})
	if err != nil {
		t.Fatal(err)
	}
	return vecs[0]
}

func dot(a, b []float32) float64 {
	var s float64
	for i := range a {
		s += float64(a[i]) * float64(b[i])
	}
	return s
}

func TestLocalModelAndShape(t *testing.T) {
	l := NewLocal(LocalOptions{})
	if l.Model() != "local-hash-v1/256" {
		t.Fatalf("Model() = %q", l.Model())
	}
	vecs, err := l.Embed(context.Background(), []string{"token bucket", "", "!!! ..."})
	if err != nil {
		t.Fatal(err)
	}
	if len(vecs) != 3 || len(vecs[0]) != 256 {
		t.Fatalf("got %d vectors of %d dims", len(vecs), len(vecs[0]))
	}
	if n := dot(vecs[0], vecs[0]); math.Abs(n-1) > 1e-5 {
		t.Errorf("|v|^2 = %v, want 1", n)
	}
	for _, v := range vecs[1:] {
		if n := dot(v, v); n != 0 {
			t.Errorf("text without words: |v|^2 = %v, want 0", n)
		}
	}
	if got := NewLocal(LocalOptions{Dims: 64}).Model(); got != "local-hash-v1/64" {
		t.Errorf("Model() with 64 dims = %q", got)
	}
}

func TestLocalDeterministic(t *testing.T) {
	a := embedOne(t, NewLocal(LocalOptions{}), "How does a token bucket refill?")
	b := embedOne(t, NewLocal(LocalOptions{}), "How does a token bucket refill?")
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("dimension %d differs between two embedders: %v vs %v", i, a[i], b[i])
		}
	}
}

// The embedding cache lower-cases and collapses white space in its keys and
// embeds the normalised text; that is only free of loss if Local maps both
// forms to the very same vector.
func TestLocalIgnoresWhatNormalisationRemoves(t *testing.T) {
	l := NewLocal(LocalOptions{})
	for _, q := range []string{
		"  How   does a\tTOKEN bucket\nrefill? ",
		"Ünïcode ÉTÉ straße ΣΊΣΥΦΟΣ",
		"P99 latency — why?",
	} {
		a := embedOne(t, l, q)
		b := embedOne(t, l, NormalizeQuery(q, false))
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("%q: dimension %d differs after normalisation", q, i)
			}
		}
	}
}

func TestLocalSimilarity(t *testing.T) {
	l := NewLocal(LocalOptions{})
	q := embedOne(t, l, "how does a token bucket refill")
	related := embedOne(t, l, "A token bucket holds up to a burst of tokens and refills at a steady rate.")
	unrelated := embedOne(t, l, "Server-sent events stream text over a long-lived HTTP response.")
	if dot(q, related) <= dot(q, unrelated) {
		t.Errorf("cos(query, related) = %.3f <= cos(query, unrelated) = %.3f", dot(q, related), dot(q, unrelated))
	}
	// Character trigrams make inflections close.
	a := embedOne(t, l, "refills")
	b := embedOne(t, l, "refill")
	c := embedOne(t, l, "semaphore")
	if dot(a, b) < 0.15 || dot(a, b) <= dot(a, c) {
		t.Errorf("cos(refills, refill) = %.3f, cos(refills, semaphore) = %.3f", dot(a, b), dot(a, c))
	}
}

func TestLocalCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := NewLocal(LocalOptions{}).Embed(ctx, []string{"x"}); err == nil {
		t.Fatal("Embed with a cancelled context succeeded")
	}
}

func TestNormalizeQuery(t *testing.T) {
	cases := []struct {
		in       string
		keepCase bool
		want     string
	}{
		{"hello world", false, "hello world"},
		{"  Hello \t\n World  ", false, "hello world"},
		{"  Hello \t\n World  ", true, "Hello World"},
		{"", false, ""},
		{"   ", false, ""},
		{"ÉTÉ\u00a0Été", false, "été été"},
		{"a  b", false, "a b"},
		{"a\tb", false, "a b"},
		{"a ", false, "a"},
	}
	for _, tc := range cases {
		if got := NormalizeQuery(tc.in, tc.keepCase); got != tc.want {
			t.Errorf("NormalizeQuery(%q, %v) = %q, want %q", tc.in, tc.keepCase, got, tc.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { NormalizeQuery("already normal query", false) }); n != 0 {
		t.Errorf("normalising a normal query allocates %v times", n)
	}
}

func BenchmarkLocalEmbed(b *testing.B) {
	l := NewLocal(LocalOptions{})
	ctx := context.Background()
	b.Run("query", func(b *testing.B) {
		texts := []string{"How does a token bucket refill when the gateway is under load?"}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := l.Embed(ctx, texts); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("chunk", func(b *testing.B) {
		texts := []string{`A token bucket holds up to B tokens and gains r tokens per second, never more than B. Each request takes one token (or as many as it costs, for example its estimated LLM tokens) and is rejected or delayed when the bucket is empty. The capacity B is the burst a client may send at once after being idle; r is the sustained rate. Refill is usually computed lazily: on each request the limiter adds r times the time elapsed since the last update, caps the result at B and stores the new count and timestamp, so no timer runs per bucket.`}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := l.Embed(ctx, texts); err != nil {
				b.Fatal(err)
			}
		}
	})
}
