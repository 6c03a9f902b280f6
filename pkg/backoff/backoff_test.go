package backoff

import (
	"context"
	"errors"
	"testing"
	"time"
)

var errDown = errors.New("down")

// Waits double from First up to Max, and a success ends the retries.
func TestRetryDoublesUpToMaxUntilSuccess(t *testing.T) {
	var at []time.Time
	err := Policy{First: 10 * time.Millisecond, Max: 40 * time.Millisecond}.Retry(context.Background(), 0, func() error {
		at = append(at, time.Now())
		if len(at) < 5 {
			return errDown
		}
		return nil
	})
	if err != nil || len(at) != 5 {
		t.Fatalf("err %v after %d tries, want success on the 5th", err, len(at))
	}
	for i, want := range []time.Duration{10, 20, 40, 40} {
		if got := at[i+1].Sub(at[i]); got < want*time.Millisecond {
			t.Errorf("wait %d was %s, want at least %dms", i+1, got, want)
		}
	}
}

// Patience stops the retries before a wait that would end past it, with
// f's last error.
func TestRetryGivesUpAtItsPatience(t *testing.T) {
	tries := 0
	start := time.Now()
	err := Policy{First: 20 * time.Millisecond, Max: time.Second}.Retry(context.Background(), 100*time.Millisecond, func() error {
		tries++
		return errDown
	})
	if !errors.Is(err, errDown) || time.Since(start) > 100*time.Millisecond {
		t.Fatalf("err %v after %s, want errDown within the patience", err, time.Since(start))
	}
	if tries != 3 {
		t.Fatalf("%d tries, want 3 (after 20 and 40 ms; the next, 80 ms later, would end past 100 ms)", tries)
	}
}

// An ended context stops the retries at once, with f's last error.
func TestRetryStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := Policy{First: time.Hour, Max: time.Hour}.Retry(ctx, 0, func() error { return errDown })
	if !errors.Is(err, errDown) || time.Since(start) > time.Second {
		t.Fatalf("err %v after %s, want errDown when the context ended", err, time.Since(start))
	}
}

// An error marked Stop ends the retries at once, as itself.
func TestRetryStopsAtAFinalError(t *testing.T) {
	tries := 0
	err := Policy{First: time.Millisecond, Max: time.Millisecond}.Retry(context.Background(), 0, func() error {
		tries++
		return Stop(errDown)
	})
	if err != errDown || tries != 1 {
		t.Fatalf("err %v after %d tries, want errDown itself after one", err, tries)
	}
	if Stop(nil) != nil {
		t.Fatal("Stop(nil) is not nil")
	}
}
