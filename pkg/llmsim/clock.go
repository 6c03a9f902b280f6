package llmsim

import (
	"context"
	"time"
)

// clock is simulated time. Everything the engine measures or waits for is in
// simulated time, so metrics look the same whatever the TimeScale.
type clock interface {
	Now() time.Time
	// SleepUntil blocks until simulated time t or until ctx is done.
	SleepUntil(ctx context.Context, t time.Time) error
}

// scaledClock runs simulated time 1/scale times as fast as wall time,
// starting from the wall time at which it was made.
type scaledClock struct {
	start time.Time
	scale float64
}

func newScaledClock(scale float64) *scaledClock {
	return &scaledClock{start: time.Now(), scale: scale}
}

func (c *scaledClock) Now() time.Time {
	return c.start.Add(time.Duration(float64(time.Since(c.start)) / c.scale))
}

func (c *scaledClock) SleepUntil(ctx context.Context, t time.Time) error {
	wall := time.Duration(float64(t.Sub(c.Now())) * c.scale)
	if wall <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(wall)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
