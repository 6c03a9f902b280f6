package logsample

import (
	"testing"
	"time"
)

// The first event of a kind gets its line; the rest within Every are
// counted onto the next line, and kinds are apart.
func TestSamplerOneLineAWindowPerKind(t *testing.T) {
	s := New()
	now := time.Unix(1000, 0)
	s.Now = func() time.Time { return now }
	if skipped, ok := s.Allow("a"); !ok || skipped != 0 {
		t.Fatalf("first a: %d %v", skipped, ok)
	}
	for range 3 {
		if _, ok := s.Allow("a"); ok {
			t.Fatal("a within the window got a line")
		}
	}
	if _, ok := s.Allow("b"); !ok {
		t.Fatal("first b got no line")
	}
	now = now.Add(Every - time.Millisecond)
	if _, ok := s.Allow("a"); ok {
		t.Fatal("a just before the window's end got a line")
	}
	now = now.Add(time.Millisecond)
	if skipped, ok := s.Allow("a"); !ok || skipped != 4 {
		t.Fatalf("a after the window: skipped %d, line %v; want 4, true", skipped, ok)
	}
}
