package waitroom

import (
	"testing"
	"time"
)

// A tenant's waiters leave earliest deadline first in the places its
// waiters hold: the priority waiter that came last takes the first flex
// waiter's place (tag, charge and shift), each flex one the next place,
// and another tenant's waiter between them keeps its turn. Each place,
// with its charge, is held by exactly one waiter, so no charge is taken
// twice or lost.
func TestTenantsWaitersSwapPlacesByDeadline(t *testing.T) {
	r := newRoom(t, 1, 10, nil)
	holder := enter(t, r, "x", 1, true)
	now := time.Now()
	in := func(tenant string, tag int64, deadline time.Time, slo time.Duration) *Waiter {
		t.Helper()
		w, err := r.Enter(Ticket{Pool: "short", Tenant: tenant, Weight: 1, Tag: tag, Charge: tag / 10, Shift: tag / 100,
			Deadline: deadline, SLO: slo}, true)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	flex1 := in("a", 100, time.Time{}, 0)
	other := in("b", 150, now.Add(time.Second), time.Second)
	flex2 := in("a", 200, time.Time{}, 0)
	prio := in("a", 300, now.Add(time.Second), time.Second)
	order := []*Waiter{prio, other, flex1, flex2}
	places := []Place{{100, 10, 1}, {150, 15, 1}, {200, 20, 2}, {300, 30, 3}}
	for i, w := range order {
		if p := w.Position(); p != i+1 {
			t.Errorf("waiter %d at position %d, want %d", i, p, i+1)
		}
		if p := w.Place(); p != places[i] {
			t.Errorf("waiter %d holds %+v, want %+v", i, p, places[i])
		}
	}
	holder.Leave()
	for i, w := range order {
		if !admitted(w, time.Second) {
			t.Fatalf("waiter %d not admitted in its turn", i)
		}
		for _, o := range order[i+1:] {
			if admitted(o, 0) {
				t.Fatalf("a waiter after %d admitted with its slot", i)
			}
		}
		if p := w.Place(); p != places[i] {
			t.Errorf("admitted waiter %d holds %+v, want %+v", i, p, places[i])
		}
		w.Leave()
	}
}

// Waiters of one SLO keep their arrival order whatever their deadlines
// say (arrival read on clocks that differ), as without deadlines; a
// waiter of a tighter SLO still goes ahead of them.
func TestOneSLOKeepsArrivalOrderAtTheDoor(t *testing.T) {
	r := newRoom(t, 1, 10, nil)
	enter(t, r, "x", 1, true)
	now := time.Now()
	var ws []*Waiter
	for i, at := range []time.Duration{30, 20, 10, 40} {
		slo := time.Second
		if i == 3 {
			slo = 500 * time.Millisecond
		}
		w, err := r.Enter(Ticket{Pool: "short", Tenant: "a", Weight: 1, Tag: int64(100 * (i + 1)),
			Deadline: now.Add(at*time.Millisecond + slo), SLO: slo}, true)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	for i, want := range []int{2, 3, 4, 1} {
		if p := ws[i].Position(); p != want {
			t.Errorf("waiter %d at %d, want %d", i, p, want)
		}
	}
	if p := ws[3].Place(); p.Tag != 100 {
		t.Errorf("the 500 ms waiter holds %+v, want the first place, tag 100", p)
	}
}
