package door_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

// A priority request of acme's that comes to the door after a flex one of
// acme's, both waiting, starts first, at the place the flex one reserved
// (the earlier); the flex one starts at the priority one's. Each workflow
// carries its deadline (arrival plus its class's TTFT SLO; none for
// flex), and both places are taken by the workflows: none is given back
// or taken twice.
func TestDoorStartsATenantsEarliestDeadlineFirst(t *testing.T) {
	s := newStack(t, func(c *config.Config) { onePermit(c); withClasses(c) })
	ctx := context.Background()
	flex, held := s.waitAtDoor(ctx, s.classRequest(request.ClassFlex))
	before := time.Now()
	prio, err := s.door.Admit(ctx, acme, s.classRequest(request.ClassPriority))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prio.Sub.Close)
	if st := s.door.Room(); st.Waiting != 2 {
		t.Fatalf("room %+v, want both waiting", st)
	}
	s.release(held...)
	eventually(t, "both to start", func() bool { return len(s.temporal.inputs()) == 2 })
	ins := s.temporal.inputs()
	first, second := ins[0], ins[1]
	if first.RequestID != prio.ID || second.RequestID != flex.ID {
		t.Fatalf("started %s then %s, want the priority request %s first", first.RequestID, second.RequestID, prio.ID)
	}
	if first.AdmissionPlace.Tag == 0 || first.AdmissionPlace.Tag >= second.AdmissionPlace.Tag || first.AdmissionPlace.Charge == 0 {
		t.Fatalf("places %+v then %+v: want the priority request at the earlier place, with its charge", first.AdmissionPlace, second.AdmissionPlace)
	}
	if first.AdmissionPlace.Weight != 9 || first.AdmissionPlace.Tenant != "acme" || first.AdmissionPlace.Pool != request.PoolShort {
		t.Errorf("priority place %+v, want acme's in short at its own weight 9", first.AdmissionPlace)
	}
	slo := 700 * time.Millisecond
	if d := first.Deadline; d.Before(before.Add(slo)) || d.After(time.Now().Add(slo)) {
		t.Errorf("priority deadline %s, want its arrival plus %s", d, slo)
	}
	if !second.Deadline.IsZero() {
		t.Errorf("flex deadline %s, want none", second.Deadline)
	}
	if n := s.placesReserved("acme"); n != 2 {
		t.Errorf("%d places reserved, want the two the workflows queue at", n)
	}
}

// finishOf is tenant's last tag in the fair order of the door's pools.
func (s *stack) finishOf(tenant string) int64 {
	s.t.Helper()
	ctx := context.Background()
	keys, err := s.rdb.Keys(ctx, s.cfg.Redis.KeyPrefix+"adm:*finish").Result()
	if err != nil {
		s.t.Fatal(err)
	}
	var f int64
	for _, k := range keys {
		if v, err := s.rdb.HGet(ctx, k, tenant).Int64(); err == nil {
			f = max(f, v)
		}
	}
	return f
}

// A waiter that took another's place and then leaves the door gives back
// the place it holds, not the one it reserved: the flex request, now
// holding the last place, keeps its tenant's last tag where it is and
// starts there.
func TestWaiterGivesBackThePlaceItHolds(t *testing.T) {
	s := newStack(t, func(c *config.Config) { onePermit(c); withClasses(c) })
	ctx := context.Background()
	flex, held := s.waitAtDoor(ctx, s.classRequest(request.ClassFlex))
	pctx, leave := context.WithCancel(ctx)
	prio, err := s.door.Admit(pctx, acme, s.classRequest(request.ClassPriority))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prio.Sub.Close)
	last := s.finishOf("acme")
	leave()
	// Its end is written after what it held was given back.
	eventually(t, "the priority request to end", func() bool {
		last, ok, _ := s.events.Last(ctx, prio.ID)
		return ok && events.Terminal(last.Type)
	})
	if f := s.finishOf("acme"); f != last {
		t.Fatalf("acme's last tag moved from %d to %d: the place given back was the last one, which flex holds", last, f)
	}
	s.release(held...)
	eventually(t, "the flex request to start", func() bool { return len(s.temporal.inputs()) == 1 })
	if in := s.temporal.only(t).in; in.RequestID != flex.ID || in.AdmissionPlace.Tag != last {
		t.Fatalf("started %s at %+v, want flex at acme's last place %d", in.RequestID, in.AdmissionPlace, last)
	}
}
