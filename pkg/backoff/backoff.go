// Package backoff retries a call that fails for a while — a Redis that
// restarts, fails over or stalls — waiting between tries, each wait
// twice the last up to a cap.
package backoff

import (
	"context"
	"errors"
	"time"
)

// Policy is how long to wait between tries: First after the first
// failure, doubling up to Max.
type Policy struct {
	First, Max time.Duration
}

// Retry calls f until it succeeds, f's error is one of Stop, ctx ends,
// or, with patience > 0, the next wait would end more than patience after
// Retry began. It returns nil, or f's last error (unwrapped from Stop).
func (p Policy) Retry(ctx context.Context, patience time.Duration, f func() error) error {
	var deadline time.Time
	if patience > 0 {
		deadline = time.Now().Add(patience)
	}
	for wait := p.First; ; wait = min(2*wait, p.Max) {
		err := f()
		var final stopped
		if errors.As(err, &final) {
			return final.err
		}
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

// Stop marks err as one that waiting will not mend: Retry returns it at
// once. Stop(nil) is nil.
func Stop(err error) error {
	if err == nil {
		return nil
	}
	return stopped{err}
}

type stopped struct{ err error }

func (s stopped) Error() string { return s.err.Error() }
