package integration

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows/signal"
)

// With one permit and three tenants weighted 5:3:2 all backlogged, the
// requests reach retrieval (the first stage after admission) in weighted
// fair order: about 50/30/20 while every tenant has requests waiting, and
// each tenant's own requests in the order they arrived. The precise
// fairness check is at the Lua level (pkg/admission); this one shows the
// wiring end to end: API key → tier weight → workflow → admission.
func TestFairOrderEndToEnd(t *testing.T) {
	const perTenant = 12
	// The first grants, while all three tenants are still backlogged (the
	// heaviest has 12 waiting and gets about 10 of 20).
	const window = 20
	tenants := []struct {
		key, name string
		share     float64
	}{{"k-fair-vip", "fair-vip", 0.5}, {"k-fair-std", "fair-std", 0.3}, {"k-fair-free", "fair-free", 0.2}}

	setPoolLimits(t, 1, 1)
	holder := fmt.Sprintf("holder-%s-%d", t.Name(), time.Now().UnixNano())
	if r, err := stack.gate.Enqueue(context.Background(), "short", admission.Request{ID: holder, Tenant: "holders", Weight: 1}); err != nil || r.Status != admission.Granted {
		t.Fatalf("hold the permit: %+v %v", r, err)
	}
	t.Cleanup(func() { _, _ = stack.gate.Release(context.Background(), "short", holder) })
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	type retrieval struct {
		tenant string
		seq    int // the tenant's arrival number
		ms     int64
		// answered: the request ended with done, not cancelled.
		answered *bool
	}
	var mu sync.Mutex
	var entered []retrieval
	// entering counts retrievals as they are reported.
	entering := make(chan struct{}, 3*perTenant)
	var streams []*stream
	keys := map[string]string{} // request id -> its tenant's API key
	var readers sync.WaitGroup
	defer func() {
		cancel()
		for _, s := range streams {
			s.close()
		}
		readers.Wait()
	}()
	// Arrivals interleave; each request is queued before the next is sent,
	// so arrival order is known.
	for i := range perTenant {
		for _, tn := range tenants {
			s := open(t, ctx, http.MethodPost, "/v1/chat", `{"query":"What does weighted fair queuing guarantee?","max_tokens":8}`,
				map[string]string{"Authorization": "Bearer " + tn.key})
			streams = append(streams, s)
			keys[s.id] = tn.key
			// Keep the holder's lease while the backlog builds, however
			// slow the machine: its permit must pass on by release.
			if ok, err := stack.gate.Renew(ctx, "short", holder); err != nil || !ok {
				t.Fatalf("renew the holder's permit: %v %v", ok, err)
			}
			s.until(t, func(ev testenv.SSEEvent) bool {
				if terminal(ev) {
					t.Fatalf("%s request %d ended before it was queued: %+v", tn.name, i, ev)
				}
				return ev.Event == events.TypeQueue
			})
			readers.Add(1)
			answered := new(bool)
			go func() {
				defer readers.Done()
				for {
					ev, err := s.r.Next()
					if err != nil {
						if ctx.Err() == nil {
							t.Errorf("stream of %s: %v", s.id, err)
						}
						return
					}
					var st events.Stage
					if ev.Event == events.TypeStage && ev.Decode(&st) == nil && st.Stage == "retrieval" {
						mu.Lock()
						entered = append(entered, retrieval{tenant: tn.name, seq: i, ms: entryMs(t, ev.ID), answered: answered})
						mu.Unlock()
						entering <- struct{}{}
					}
					if terminal(ev) {
						mu.Lock()
						*answered = ev.Event == events.TypeDone
						mu.Unlock()
						return
					}
				}
			}()
		}
	}

	// Hand the permit on as a finishing request does; from here the
	// requests pass it to each other.
	rel, err := stack.gate.Release(ctx, "short", holder)
	if err != nil || len(admission.IDs(rel.Woken)) != 1 {
		t.Fatalf("release the holder: %+v %v", rel, err)
	}
	if err := admission.Wake(ctx, stack.gate, signal.Notifier{Client: stack.temporal}, rel.Woken); err != nil {
		t.Fatal(err)
	}
	for seen := 0; seen < window; {
		select {
		case <-entering:
			seen++
		case <-ctx.Done():
			t.Fatalf("only %d of %d requests reached retrieval", seen, window)
		}
	}
	// The rest are not needed: cancel them (202, or 409 if finished).
	for _, s := range streams {
		req, _ := http.NewRequestWithContext(ctx, http.MethodDelete, stack.baseURL+"/v1/requests/"+s.id, nil)
		req.Header.Set("Authorization", "Bearer "+keys[s.id])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted && resp.StatusCode != http.StatusConflict {
			t.Fatalf("DELETE %s: %d", s.id, resp.StatusCode)
		}
	}
	// Every stream ends with a terminal event: a request still waiting at
	// the door is cancelled there (it never starts a workflow), the others
	// by their workflow. Once all are read, every retrieval is known, in
	// whatever order the readers reported them.
	readDone := make(chan struct{})
	go func() {
		readers.Wait()
		close(readDone)
	}()
	select {
	case <-readDone:
	case <-ctx.Done():
		t.Fatal("streams did not end after their requests closed")
	}
	mu.Lock()
	order := slices.Clone(entered)
	mu.Unlock()
	// One permit: a request reaches retrieval only after the one before it
	// finished, so the streams' clocks order them.
	sort.SliceStable(order, func(i, j int) bool { return order[i].ms < order[j].ms })
	// Within a tenant the sequence numbers only grow, one by one in the
	// window. Past it gaps are allowed: the cancellations above can take a
	// tenant's next waiters out of the queue before the permit frees, and
	// a later one still waiting then gets it; and a request cancelled just
	// after its grant may write its retrieval stage after the next one,
	// to which its cancel passed the permit, so only answered requests
	// are held to the order there.
	next := map[string]int{}
	for i, e := range order {
		if i >= window && !*e.answered {
			// Cancelled past the window: its stage event may be written
			// after the cancel freed its permit for the next request.
			continue
		}
		switch {
		case e.seq < next[e.tenant]:
			t.Errorf("%s's request %d reached retrieval after its request %d: order inversion within a tenant", e.tenant, e.seq, next[e.tenant]-1)
		case i < window && e.seq != next[e.tenant]:
			t.Errorf("%s's request %d reached retrieval when %d was next, before any was cancelled", e.tenant, e.seq, next[e.tenant])
		}
		next[e.tenant] = e.seq + 1
	}
	var seq []string
	got := map[string]int{}
	for _, e := range order[:window] {
		seq = append(seq, fmt.Sprintf("%s#%d", e.tenant, e.seq))
		got[e.tenant]++
	}
	t.Logf("first %d grants: %s", window, strings.Join(seq, " "))
	for _, tn := range tenants {
		share := float64(got[tn.name]) / window
		if math.Abs(share-tn.share) > 0.10 {
			t.Errorf("%s got %.0f%% of the first %d grants, want %.0f%% ± 10", tn.name, 100*share, window, 100*tn.share)
		}
	}
	assertPoolsIdle(t)
}

// entryMs is the Redis clock (ms) of an event's stream entry id.
func entryMs(t *testing.T, id string) int64 {
	ms, _, _ := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		t.Errorf("event id %q: %v", id, err)
	}
	return n
}
