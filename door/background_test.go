package door_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/waitroom"
)

// A background request does not wait at the door, whose waiters live in
// this process: where an attached request would wait in the room (the
// pool's one permit taken, acme's own request queued), it starts at once,
// with responses.background_max_wait for its wait in the pool's queue,
// and a client gone right after the POST does not stop it.
func TestBackgroundRequestStartsWithoutWaitingAtTheDoor(t *testing.T) {
	s := newStack(t, func(c *config.Config) {
		onePermit(c)
		c.Responses.BackgroundMaxWait = 7 * time.Minute
	})
	s.fill(request.PoolShort, "acme", 2)
	ctx, cancel := context.WithCancel(context.Background())
	req := s.request("hello", 100)
	req.Background = true
	adm, err := s.door.Admit(ctx, acme, req)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Sub.Close()
	in := s.temporal.only(t).in
	if in.RequestID != adm.ID || !in.Background || in.Settings.MaxWait != 7*time.Minute || in.Settings.MaxWaitByPool != nil {
		t.Fatalf("started %s background %v max wait %s (by pool %v)", in.RequestID, in.Background, in.Settings.MaxWait, in.Settings.MaxWaitByPool)
	}
	if in.AdmissionPlace.Tag != 0 {
		t.Errorf("place %+v reserved: a background request queues as it arrives in its pool", in.AdmissionPlace)
	}
	if st := s.door.Room(); st != (waitroom.Stats{}) {
		t.Errorf("room %+v, want nobody in it", st)
	}
	near(t, "tokens charged", s.charged(), float64(s.bound("hello")+100))

	// The same request attached waits in the room instead.
	attached, err := s.door.Admit(context.Background(), acme, s.request("hello", 100))
	if err != nil {
		t.Fatal(err)
	}
	defer attached.Sub.Close()
	if st := s.door.Room(); st.Waiting != 1 || len(s.temporal.inputs()) != 1 {
		t.Errorf("room %+v with %d starts, want the attached request waiting", st, len(s.temporal.inputs()))
	}
}

// The queue caps bound background requests as any: a tenant whose share
// of the pool's queue is full is refused before anything starts.
func TestBackgroundRequestRefusedWhenItsTenantsQueueIsFull(t *testing.T) {
	s := newStack(t, func(c *config.Config) {
		onePermit(c)
		setTier(c, func(t *policy.Tier) { t.MaxQueuePerTenant = 1 })
	})
	s.fill(request.PoolShort, "acme", 2)
	req := s.request("hello", 100)
	req.Background = true
	_, err := s.door.Admit(context.Background(), acme, req)
	var e *refusal.Error
	if !errors.As(err, &e) || e.Code != request.ReasonTenantQueueFull {
		t.Fatalf("admit: %v, want tenant_queue_full", err)
	}
	if n := len(s.temporal.inputs()); n != 0 {
		t.Fatalf("%d started", n)
	}
	near(t, "tokens charged", s.charged(), 0)
}
