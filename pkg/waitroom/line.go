package waitroom

import "sort"

// line is one pool's waiters: a heap ordered by virtual finish tag, ties
// by arrival.
type line struct {
	waiters []*Waiter
	// vtime is the tag of the waiter admitted last; finish is each
	// tenant's last tag, so one tenant's waiters queue behind each other.
	vtime  float64
	finish map[string]float64
	// changed counts changes, so that positions are sorted again only
	// when the line moved (positions are asked every poll by every
	// waiter's stream).
	changed, sortedAt int
	positions         map[*Waiter]int
}

func (l *line) Len() int { return len(l.waiters) }

func (l *line) Less(i, j int) bool { return before(l.waiters[i], l.waiters[j]) }

func (l *line) Swap(i, j int) {
	l.waiters[i], l.waiters[j] = l.waiters[j], l.waiters[i]
	l.waiters[i].index, l.waiters[j].index = i, j
}

func (l *line) Push(x any) {
	w := x.(*Waiter)
	w.index = len(l.waiters)
	l.waiters = append(l.waiters, w)
}

func (l *line) Pop() any {
	n := len(l.waiters) - 1
	w := l.waiters[n]
	l.waiters[n] = nil
	l.waiters = l.waiters[:n]
	if n == 0 {
		// Every tenant is idle: none has a place to keep.
		clear(l.finish)
	}
	return w
}

func before(a, b *Waiter) bool {
	if a.tag != b.tag {
		return a.tag < b.tag
	}
	return a.seq < b.seq
}

// position is w's 1-based place in the line.
func (l *line) position(w *Waiter) int {
	if l.positions == nil || l.sortedAt != l.changed {
		order := append([]*Waiter(nil), l.waiters...)
		sort.Slice(order, func(i, j int) bool { return before(order[i], order[j]) })
		l.positions = make(map[*Waiter]int, len(order))
		for i, o := range order {
			l.positions[o] = i + 1
		}
		l.sortedAt = l.changed
	}
	return l.positions[w]
}
