package httpio

import (
	"net/http"
	"testing"

	"github.com/sluice-dev/sluice/pkg/refusal"
)

// Every class has a status of its own, and the status names the class
// back: a refusal keeps its kind through the HTTP layer.
func TestEveryClassHasItsOwnStatus(t *testing.T) {
	seen := map[int]refusal.Class{}
	for _, c := range refusal.Classes() {
		s, ok := statuses[c]
		if !ok {
			t.Fatalf("class %s has no HTTP status", c)
		}
		if other, dup := seen[s]; dup {
			t.Fatalf("classes %s and %s share status %d", c, other, s)
		}
		seen[s] = c
		if back := ClassOf(s); back != c {
			t.Errorf("status %d maps back to %s, want %s", s, back, c)
		}
	}
	if got := Status(refusal.Class(250)); got != http.StatusInternalServerError {
		t.Errorf("an unknown class is %d, want 500", got)
	}
}
