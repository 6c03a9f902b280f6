package activities_test

import (
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/events"
)

func TestEmbedQueryMissThenMemoryHit(t *testing.T) {
	h := newHarness(t, nil)
	first := mustLocal[activities.EmbedOutput](t, h, h.acts.EmbedQuery, activities.EmbedInput{RequestID: "r1", Query: query})
	if first.Cache != embed.TierMiss || first.Dims != 256 {
		t.Fatalf("first embed: %+v, want a miss of 256 dims (the local default)", first)
	}
	second := mustLocal[activities.EmbedOutput](t, h, h.acts.EmbedQuery, activities.EmbedInput{RequestID: "r2", Query: "  " + strings.ToUpper(query)})
	if second.Cache != embed.TierMemory || second.Dims != first.Dims {
		t.Fatalf("second embed of the same normalised query: %+v, want a memory hit", second)
	}
	for _, id := range []string{"r1", "r2"} {
		evs := h.events(t, id)
		if len(evs) != 1 || evs[0].Type != events.TypeStage {
			t.Fatalf("%s events: %+v, want one stage event", id, evs)
		}
		if st := decode[events.Stage](t, evs[0]); st.Stage != "embed" {
			t.Fatalf("%s stage event: %+v, want embed", id, st)
		}
	}
}
