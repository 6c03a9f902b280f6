package retrieval

import (
	"context"

	"github.com/sluice-dev/sluice/pkg/kbref"
)

// MemoryStats is what a Live holds in memory, for metrics.
type MemoryStats struct {
	// Budget is LiveOptions.MemoryBudget (0: none).
	Budget int64
	// Loaded is what the kbs held now take (KB.MemoryBytes, summed).
	Loaded int64
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
	s := l.mem
	s.Budget, s.KBs = l.budget, l.lru.Len()
	return s
}

// checkFits refuses, before anything is read, a kb whose revisions need
// more than the budget by the estimate ingestion recorded; a kb whose
// revisions carry no estimate is judged by its text alone, a lower bound.
// Then it evicts the least recently used kbs other than e until this one
// fits beside the rest, so that loading it does not take the process past
// its budget by more than the kb itself.
func (l *Live) checkFits(ctx context.Context, kb string, e *liveKB) error {
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
	l.mu.Lock()
	evicted := l.evictLocked(e, l.budget-need)
	l.mu.Unlock()
	l.logEvicted(ctx, evicted)
	return nil
}

// settle accounts e's new size after it caught up, makes it the most
// recently used, and evicts the least recently used others until the
// kbs held fit the budget. A kb that alone is larger than the budget by
// the measure (which exceeds ingestion's estimate by the free slots of a
// patched index, never more than its live ones) stays held, alone.
func (l *Live) settle(ctx context.Context, kb string, e *liveKB, bytes int64) {
	l.mu.Lock()
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
		evicted = l.evictLocked(e, l.budget-bytes)
	}
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
