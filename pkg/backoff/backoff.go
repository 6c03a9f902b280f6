// Package backoff retries a call that fails for a while — a Redis that
// restarts, fails over or stalls — waiting between tries, each wait
// twice the last up to a cap.
package backoff

import (
	"context"
	"time"
)

// Policy is how long to wait between tries: First after the first
// failure, doubling up to Max.
type Policy struct {
	First, Max time.Duration
}

// Retry calls f until it succeeds, ctx ends, or, with patience > 0, the
// next wait would end more than patience after Retry began. It returns
// nil, or f's last error.
func (p Policy) Retry(ctx context.Context, patience time.Duration, f func() error) error {
	var deadline time.Time
	if patience > 0 {
		deadline = time.Now().Add(patience)
	}
	for wait := p.First; ; wait = min(2*wait, p.Max) {
		err := f()
		if err == nil || ctx.Err() != nil || (!deadline.IsZero() && time.Now().Add(wait).After(deadline)) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}
