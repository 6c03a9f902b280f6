package activities_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/request"
)

// A stream's keep-alive charges its tenant for the output streamed so
// far (pay as you go): the request's charge grows past what its place
// was charged, and its tenant's waiting entry moves later by as much.
func TestStreamLLMChargesItsTenantAsItStreams(t *testing.T) {
	var h *harness
	var charged atomic.Int64
	fake := &fakeLLM{tokens: words(100), delay: 30 * time.Millisecond}
	fake.onToken = func(int) bool {
		// Not t.Fatal: this runs inside the activity.
		v, err := h.rdb.HGet(context.Background(), h.prefix+"adm:{short}:charged", "r1").Result()
		if err != nil {
			t.Errorf("read r1's charge: %v", err)
			return true
		}
		// "<ticks>:<weight>:-<ticks at placement>"
		f := strings.Split(v, ":")
		total, _ := strconv.ParseInt(f[0], 10, 64)
		placed, _ := strconv.ParseInt(f[len(f)-1], 10, 64)
		charged.Store(total + placed)
		return total+placed > 0
	}
	h = newHarness(t, func(o *harnessOptions) { o.streamer = fake })
	ctx := context.Background()
	for _, req := range []admission.Request{
		{ID: "hold", Tenant: "z", Weight: 1},
		{ID: "r1", Tenant: "a", Weight: 1, Cost: 0.1},
		{ID: "r2", Tenant: "a", Weight: 1, Cost: 0.1},
	} {
		if _, err := h.gate.Enqueue(ctx, request.PoolShort, req); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.gate.Release(ctx, request.PoolShort, "hold"); err != nil { // r1 granted
		t.Fatal(err)
	}
	queue := h.prefix + "adm:{short}:queue"
	before, err := h.rdb.ZScore(ctx, queue, "r2").Result()
	if err != nil {
		t.Fatal(err)
	}
	version, hits := h.retrieveContext(t, "r1", 10, 3)
	if _, err := streamAsIs(t, h, activities.LLMInput{
		RequestID: "r1", Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
	}, nil); err != nil {
		t.Fatal(err)
	}
	moved := charged.Load()
	if moved <= 0 {
		t.Fatal("a stream of up to 100 tokens over 3 s was never charged")
	}
	// Output weight 1: a token is 2520/1000 ticks, and at most the 100
	// streamed were charged.
	if moved > 252 {
		t.Errorf("charged %d ticks for at most 100 tokens, want at most 252", moved)
	}
	after, err := h.rdb.ZScore(ctx, queue, "r2").Result()
	if err != nil {
		t.Fatal(err)
	}
	if int64(after-before) != moved {
		t.Errorf("r2 moved %v ticks, want the %d its tenant was charged", after-before, moved)
	}
}
