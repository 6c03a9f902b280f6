package embed

import (
	"container/list"
	"sync"
)

// lru is a fixed-size, mutex-guarded least-recently-used map from a key
// digest to a vector. A plain Mutex, not an RWMutex: every Get moves the
// entry to the front, so reads write too.
type lru struct {
	mu    sync.Mutex
	size  int
	order *list.List // front = most recent; values are *lruEntry
	items map[[32]byte]*list.Element
}

type lruEntry struct {
	key [32]byte
	vec []float32
}

func newLRU(size int) *lru {
	return &lru{size: size, order: list.New(), items: make(map[[32]byte]*list.Element, size)}
}

func (c *lru) get(key [32]byte) ([]float32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		return nil, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*lruEntry).vec, true
}

func (c *lru) put(key [32]byte, vec []float32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		el.Value.(*lruEntry).vec = vec
		c.order.MoveToFront(el)
		return
	}
	if c.order.Len() >= c.size {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.items, oldest.Value.(*lruEntry).key)
	}
	c.items[key] = c.order.PushFront(&lruEntry{key: key, vec: vec})
}

func (c *lru) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
