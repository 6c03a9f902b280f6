// Package semaphore is a counting semaphore in Redis whose permits are
// leases: shared by every process, renewed by their holder while it works,
// and given back by themselves when a holder dies. Sluice guards document
// ingestion with one (defaults: 10 concurrent uploads, a 30 s wait, a 30 s
// lease).
package semaphore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/acquire.lua
	acquireLua string
	//go:embed lua/renew.lua
	renewLua string

	acquireScript = redis.NewScript(acquireLua)
	renewScript   = redis.NewScript(renewLua)
)

// Redis is what the semaphore needs of a go-redis client.
type Redis interface {
	redis.Scripter
	ZRem(ctx context.Context, key string, members ...any) *redis.IntCmd
}

// Semaphore is one named semaphore.
type Semaphore struct {
	rdb   Redis
	key   string
	limit int
	lease time.Duration
	// poll is how often a waiter tries again.
	poll time.Duration
}

// Options configures a Semaphore.
type Options struct {
	// Key is its Redis key.
	Key string
	// Limit is the number of permits.
	Limit int
	// Lease is how long a permit lasts without a renewal.
	Lease time.Duration
	// Poll is how often a waiter tries again. Default 50ms.
	Poll time.Duration
}

// New returns a Semaphore.
func New(rdb Redis, opts Options) (*Semaphore, error) {
	if opts.Key == "" || opts.Limit <= 0 || opts.Lease < 3*time.Millisecond {
		return nil, fmt.Errorf("semaphore %q: needs a key, a limit > 0 and a lease", opts.Key)
	}
	if opts.Poll <= 0 {
		opts.Poll = 50 * time.Millisecond
	}
	return &Semaphore{rdb: rdb, key: opts.Key, limit: opts.Limit, lease: opts.Lease, poll: opts.Poll}, nil
}

// ErrTimeout is Acquire that waited maxWait without a permit.
var ErrTimeout = errors.New("no permit free in time")

// Permit is a held permit. Release it exactly once.
type Permit struct {
	s      *Semaphore
	holder string
	stop   chan struct{}
	done   chan struct{}
	lost   chan struct{}
}

// Acquire waits up to maxWait for a permit for holder (a unique name),
// then renews its lease in the background until Release.
func (s *Semaphore) Acquire(ctx context.Context, holder string, maxWait time.Duration) (*Permit, error) {
	deadline := time.Now().Add(maxWait)
	for {
		ok, err := acquireScript.Run(ctx, s.rdb, []string{s.key}, holder, s.limit, s.lease.Milliseconds()).Int()
		if err != nil {
			return nil, fmt.Errorf("acquire %s permit: %w", s.key, err)
		}
		if ok == 1 {
			p := &Permit{s: s, holder: holder, stop: make(chan struct{}), done: make(chan struct{}), lost: make(chan struct{})}
			go p.renew()
			return p, nil
		}
		wait := min(s.poll, time.Until(deadline))
		if wait <= 0 {
			return nil, fmt.Errorf("acquire %s permit: %w (waited %v)", s.key, ErrTimeout, maxWait)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("acquire %s permit: %w", s.key, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// Lost is closed if the permit's lease ran out before Release (renewals
// failed): the holder should stop, since another may now hold it.
func (p *Permit) Lost() <-chan struct{} { return p.lost }

func (p *Permit) renew() {
	defer close(p.done)
	t := time.NewTicker(p.s.lease / 3)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), p.s.lease/3)
			ok, err := renewScript.Run(ctx, p.s.rdb, []string{p.s.key}, p.holder, p.s.lease.Milliseconds()).Int()
			cancel()
			if err == nil && ok == 0 {
				close(p.lost)
				return
			}
		}
	}
}

// Release gives the permit back.
func (p *Permit) Release(ctx context.Context) error {
	close(p.stop)
	<-p.done
	if err := p.s.rdb.ZRem(ctx, p.s.key, p.holder).Err(); err != nil {
		return fmt.Errorf("release %s permit: %w", p.s.key, err)
	}
	return nil
}
