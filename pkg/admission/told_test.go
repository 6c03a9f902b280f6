package admission

import (
	"testing"
	"time"
)

// Near the head every move is told; far back only a move of a twentieth
// of the place, or any move once positionRefresh passed.
func TestWorthTelling(t *testing.T) {
	at := time.Unix(1000, 0)
	soon, late := at.Add(time.Second), at.Add(positionRefresh)
	for _, tc := range []struct {
		name string
		told Told
		pos  int
		now  time.Time
		want bool
	}{
		{"never told", Told{}, 1500, soon, true},
		{"unchanged", Told{Position: 7, At: at}, 7, late, false},
		{"near the head, one place", Told{Position: 19, At: at}, 18, soon, true},
		{"far back, a few places", Told{Position: 1500, At: at}, 1426, soon, false},
		{"far back, a twentieth", Told{Position: 1500, At: at}, 1425, soon, true},
		{"far back, moved back by a twentieth", Told{Position: 100, At: at}, 105, soon, true},
		{"far back, a few places after the refresh", Told{Position: 1500, At: at}, 1499, late, true},
	} {
		if got := WorthTelling(tc.told, tc.pos, tc.now); got != tc.want {
			t.Errorf("%s: WorthTelling(%+v, %d) = %v, want %v", tc.name, tc.told, tc.pos, got, tc.want)
		}
	}
}
