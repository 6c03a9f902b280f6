package embed

import (
	"context"
	"errors"
	"sync"
)

// flight lets one caller per key compute a vector while concurrent callers
// for the same key wait for its result, so a burst of identical new
// queries costs one Redis round trip and one embedding, not one each.
type flight struct {
	mu    sync.Mutex
	calls map[[32]byte]*call
}

type call struct {
	done chan struct{}
	vec  []float32
	tier string
	err  error
}

// do runs fn for key unless a call for key is in flight, in which case it
// waits for that call (or for ctx). shared reports that another caller ran
// fn.
func (f *flight) do(ctx context.Context, key [32]byte, fn func() ([]float32, string, error)) (vec []float32, tier string, shared bool, err error) {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = make(map[[32]byte]*call)
	}
	if c, ok := f.calls[key]; ok {
		f.mu.Unlock()
		select {
		case <-c.done:
			return c.vec, c.tier, true, c.err
		case <-ctx.Done():
			return nil, "", true, ctx.Err()
		}
	}
	// The error stands if fn panics, so that waiters do not take a nil
	// vector for a result.
	c := &call{done: make(chan struct{}), err: errors.New("embedding call did not complete")}
	f.calls[key] = c
	f.mu.Unlock()

	defer func() {
		f.mu.Lock()
		delete(f.calls, key)
		f.mu.Unlock()
		close(c.done)
	}()
	c.vec, c.tier, c.err = fn()
	return c.vec, c.tier, false, c.err
}
