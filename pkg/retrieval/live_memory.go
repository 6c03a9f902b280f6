package retrieval

import (
	"container/list"
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/pkg/kbref"
)

// MemoryStats is what a Live holds in memory, for metrics.
type MemoryStats struct {
	// Budget is LiveOptions.MemoryBudget (0: none).
	Budget int64
	// Loaded is what the kbs held now take (KB.MemoryBytes, summed).
	Loaded int64
	// Reserved is what the kbs being loaded will take, by the estimate
	// they reserved before they were read. Loaded+Reserved stays within
	// the budget (see reserve).
	Reserved int64
	// KBs is how many are held.
	KBs int
	// Loads counts kbs loaded whole (first use, or again after eviction),
	// Evictions the kbs dropped to stay within the budget, Refused the
	// queries of kbs larger than the budget.
	Loads, Evictions, Refused uint64
}

// MemoryStats reads the counters.
func (l *Live) MemoryStats() MemoryStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.statsLocked()
}

func (l *Live) statsLocked() MemoryStats {
	s := l.mem
	s.Budget, s.KBs = l.budget, l.lru.Len()
	return s
}

// reserve holds, before anything of kb is read, what loading it will
// take against the budget, so that loads running at once never hold more
// than the budget together with the kbs held: it is the estimate
// ingestion recorded for the kb's revisions (for revisions without one,
// their text, a lower bound) and the index's fixed maps. A kb whose
// estimate alone exceeds the budget is refused. Otherwise the load waits,
// in arrival order, while the loads in flight have reserved the room it
// needs (they end soon, and what they load can then be evicted), then
// evicts the least recently used kbs other than e until it fits beside
// the rest. What the loaded index measures above its reservation (at most
// its last page's empty slots) is the estimate's error: settle evicts for
// it, and it is over the budget only while the rest is reserved.
func (l *Live) reserve(ctx context.Context, kb string, e *liveKB) error {
	if l.budget <= 0 {
		return nil
	}
	u, err := l.store.Usage(ctx, kb)
	if err != nil {
		return err
	}
	need := max(u.Memory, u.Bytes)
	if need > l.budget {
		l.mu.Lock()
		l.mem.Refused++
		l.mu.Unlock()
		name := kb
		if ref, err := kbref.ParseKey(kb); err == nil {
			name = ref.Name
		}
		return &TooLargeError{KB: name, Bytes: need, Budget: l.budget}
	}
	// A kb within the budget by its estimate is loaded even when its
	// fixed maps take it past: it then stays alone (see settle).
	need = min(need+indexBytes, l.budget)
	l.mu.Lock()
	l.releaseLocked(e)
	turn := l.waiting.PushBack(e)
	for l.waiting.Front() != turn || l.mem.Reserved+need > l.budget {
		freed := l.freed
		l.mu.Unlock()
		select {
		case <-freed:
			l.mu.Lock()
		case <-ctx.Done():
			l.mu.Lock()
			l.leaveLocked(turn)
			l.mu.Unlock()
			return fmt.Errorf("wait for memory to load kb %s: %w", kb, context.Cause(ctx))
		}
	}
	l.leaveLocked(turn)
	e.reserved = need
	l.mem.Reserved += need
	evicted := l.evictLocked(e, l.budget-l.mem.Reserved)
	l.traceLocked()
	l.mu.Unlock()
	l.logEvicted(ctx, evicted)
	return nil
}

// leaveLocked takes a load off the waiting list; the next may go.
func (l *Live) leaveLocked(turn *list.Element) {
	if l.waiting.Front() == turn {
		l.wakeLocked()
	}
	l.waiting.Remove(turn)
}

func (l *Live) wakeLocked() {
	close(l.freed)
	l.freed = make(chan struct{})
}

// release gives back what e reserved, if anything: its load failed.
func (l *Live) release(e *liveKB) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(e)
}

func (l *Live) releaseLocked(e *liveKB) {
	if e.reserved == 0 {
		return
	}
	l.mem.Reserved -= e.reserved
	e.reserved = 0
	l.wakeLocked()
	l.traceLocked()
}

func (l *Live) traceLocked() {
	if l.trace != nil {
		l.trace(l.statsLocked())
	}
}

// settle accounts e's new size after it caught up in place of what its
// load reserved, makes it the most recently used, and evicts the least
// recently used others until the kbs held fit the budget beside the loads
// in flight. A kb that alone is larger than the budget by the measure
// (which exceeds ingestion's estimate by the free slots of a patched
// index, never more than its live ones) stays held, alone.
func (l *Live) settle(ctx context.Context, kb string, e *liveKB, bytes int64) {
	l.mu.Lock()
	l.releaseLocked(e)
	if cur, ok := l.kbs[kb]; cur != e {
		if ok {
			// Evicted while it caught up, and being loaded again by
			// another entry: this one is dropped when its callers are done.
			l.mu.Unlock()
			return
		}
		l.kbs[kb] = e
	}
	l.mem.Loaded += bytes - e.bytes
	e.bytes = bytes
	if e.elem == nil {
		e.elem = l.lru.PushFront(e)
	} else {
		l.lru.MoveToFront(e.elem)
	}
	var evicted []evictedKB
	if l.budget > 0 {
		evicted = l.evictLocked(e, l.budget-bytes-l.mem.Reserved)
	}
	l.traceLocked()
	l.mu.Unlock()
	l.logEvicted(ctx, evicted)
}

type evictedKB struct {
	name  string
	bytes int64
}

// evictLocked drops the least recently used kbs other than keep until the
// others take at most room. Queries already running on a dropped kb keep
// its index until they finish; the next query loads it again. Called with
// l.mu held.
func (l *Live) evictLocked(keep *liveKB, room int64) []evictedKB {
	var out []evictedKB
	for l.mem.Loaded-keep.bytes > room {
		back := l.lru.Back()
		if back == nil {
			break
		}
		victim := back.Value.(*liveKB)
		if victim == keep {
			if back = back.Prev(); back == nil {
				break
			}
			victim = back.Value.(*liveKB)
		}
		l.lru.Remove(back)
		delete(l.kbs, victim.name)
		l.mem.Loaded -= victim.bytes
		l.mem.Evictions++
		out = append(out, evictedKB{victim.name, victim.bytes})
		victim.bytes, victim.elem = 0, nil
	}
	return out
}

func (l *Live) logEvicted(ctx context.Context, evicted []evictedKB) {
	for _, v := range evicted {
		l.logger.InfoContext(ctx, "knowledge base evicted to stay within the memory budget",
			"kb", v.name, "bytes", v.bytes, "budget", l.budget)
	}
}
