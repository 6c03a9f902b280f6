package waitroom

import (
	"container/heap"
	"sort"
	"time"
)

// Place is what a waiter holds in its line: its place in the pool's fair
// order, reserved in the admission queue (Ticket.Tag, Charge and Shift; a
// zero Tag: none). A tenant's waiters of one line may swap places
// (dealByDeadline), so the door starts a request's workflow with the
// place its waiter holds when it leaves (Waiter.Place), not the one it
// reserved.
type Place struct {
	Tag, Charge, Shift int64
}

// Place is the place the waiter holds now; once it is admitted or gone,
// for good.
func (w *Waiter) Place() Place {
	r := w.room
	r.mu.Lock()
	defer r.mu.Unlock()
	return Place{Tag: w.ticket.Tag, Charge: w.ticket.Charge, Shift: w.ticket.Shift}
}

// dealByDeadline lets w's tenant's waiters of line l leave earliest
// deadline first without moving the tenant in the fair order across
// tenants: the tenant keeps the places its waiters hold, and which of
// them holds which is dealt again. w, just in, goes before the first of
// its tenant's waiters with a later deadline (one without a deadline has
// none, and keeps its arrival order behind those with one); that one
// takes the next one's place, and so on, the last taking w's. Waiters of
// one SLO keep their order, their order of arrival, so a tenant of one
// class leaves exactly as without deadlines. This is the order the
// admission queue keeps (by_deadline in admission's order.lua), so the
// room and the queue stay one order. A place carries the charge it was
// reserved with: a request that queues at another's place is charged
// that place's charge, and its release settles what it used against it
// (admission's pay as you go), so the tenant is charged each request's
// use once whatever places were swapped. r.mu is held.
func (l *line) dealByDeadline(w *Waiter) {
	var mine []*Waiter
	some := false
	for _, o := range l.waiters {
		if o.ticket.Tenant == w.ticket.Tenant {
			mine = append(mine, o)
			some = some || !o.ticket.Deadline.IsZero()
		}
	}
	if len(mine) < 2 || !some {
		return
	}
	sort.Slice(mine, func(i, j int) bool { return before(mine[i], mine[j]) })
	at := 0
	for i, o := range mine {
		if o == w {
			at = i
		}
	}
	slot := deadlineSlot(mine, at)
	dealt := make([]*Waiter, 0, len(mine))
	for i, o := range mine {
		if i == slot {
			dealt = append(dealt, w)
		}
		if i != at {
			dealt = append(dealt, o)
		}
	}
	if slot == len(mine) {
		dealt = append(dealt, w)
	}
	places := make([]held, len(mine))
	for i, o := range mine {
		places[i] = o.held()
	}
	for i, o := range dealt {
		o.takePlace(places[i])
	}
	heap.Init(l)
}

// deadlineSlot is where mine[at] goes among its tenant's waiters, in
// line order: before the first with a later deadline, but never past a
// waiter of its own SLO. It returns the index it goes before
// (len(mine): the end).
func deadlineSlot(mine []*Waiter, at int) int {
	me := mine[at].ticket
	lo, hi := 0, len(mine)-1
	for i := at - 1; i >= 0; i-- {
		if mine[i].ticket.SLO == me.SLO {
			lo = i + 1
			break
		}
	}
	for i := at + 1; i < len(mine); i++ {
		if mine[i].ticket.SLO == me.SLO {
			hi = i - 1
			break
		}
	}
	for i := lo; i <= hi; i++ {
		if i != at && later(mine[i].ticket.Deadline, me.Deadline) {
			return i
		}
	}
	return hi + 1
}

// later reports whether deadline a is later than b; a zero deadline is
// none, later than any.
func later(a, b time.Time) bool {
	switch {
	case a.IsZero():
		return !b.IsZero()
	case b.IsZero():
		return false
	}
	return a.After(b)
}

// held is a waiter's place in its line: its tag and arrival, and the
// reserved place its tag came from.
type held struct {
	tag               float64
	seq               uint64
	ticketTag, charge int64
	shift             int64
}

func (w *Waiter) held() held {
	return held{tag: w.tag, seq: w.seq, ticketTag: w.ticket.Tag, charge: w.ticket.Charge, shift: w.ticket.Shift}
}

func (w *Waiter) takePlace(h held) {
	w.tag, w.seq = h.tag, h.seq
	w.ticket.Tag, w.ticket.Charge, w.ticket.Shift = h.ticketTag, h.charge, h.shift
}
