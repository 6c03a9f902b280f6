// Package semaphore is a counting semaphore in Redis whose permits are
// leases: shared by every process, renewed by their holder while it works,
// and given back by themselves when a holder dies. Each holder belongs to
// a group, which holds at most its share of the permits: the permits
// divided among the groups holding or waiting for one, and at most a
// group limit. Sluice guards document ingestion with one, a group per
// tenant (defaults: 10 concurrent uploads, 5 of one tenant, a 30 s wait,
// a 30 s lease).
package semaphore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
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
	// groupLimit is the most permits one group holds.
	groupLimit int
	lease      time.Duration
	// poll is how often a waiter tries again.
	poll time.Duration
}

// Options configures a Semaphore.
type Options struct {
	// Key is its Redis key.
	Key string
	// Limit is the number of permits.
	Limit int
	// GroupLimit is the most permits one group may hold, however few
	// others want one. Default Limit.
	GroupLimit int
	// Lease is how long a permit lasts without a renewal.
	Lease time.Duration
	// Poll is how often a waiter tries again. Default 50ms.
	Poll time.Duration
}

// New returns a Semaphore.
func New(rdb Redis, opts Options) (*Semaphore, error) {
	if opts.Key == "" || opts.Limit <= 0 || opts.Lease < 3*time.Millisecond || opts.GroupLimit < 0 || opts.GroupLimit > opts.Limit {
		return nil, fmt.Errorf("semaphore %q: needs a key, a limit > 0, a group limit from 0 to the limit, and a lease", opts.Key)
	}
	if opts.Poll <= 0 {
		opts.Poll = 50 * time.Millisecond
	}
	if opts.GroupLimit == 0 {
		opts.GroupLimit = opts.Limit
	}
	return &Semaphore{rdb: rdb, key: opts.Key, limit: opts.Limit, groupLimit: opts.GroupLimit, lease: opts.Lease, poll: opts.Poll}, nil
}

// ErrTimeout is Acquire that waited maxWait without a permit.
var ErrTimeout = errors.New("no permit free in time")

// Permit is a held permit. Release it exactly once.
type Permit struct {
	s *Semaphore
	// member is the holder's entry in the semaphore's set.
	member string
	stop   chan struct{}
	done   chan struct{}
	lost   chan struct{}
}

// Acquire waits up to maxWait for a permit for holder (a unique name) of
// group, within the group's share, then renews its lease in the
// background until Release.
func (s *Semaphore) Acquire(ctx context.Context, group, holder string, maxWait time.Duration) (*Permit, error) {
	if strings.Contains(group, "\t") || strings.Contains(holder, "\t") || holder == "" {
		return nil, fmt.Errorf("acquire %s permit: group %q and holder %q: a holder is named, and neither holds a tab", s.key, group, holder)
	}
	member := "h\t" + group + "\t" + holder
	// A waiter's mark outlives the gap between two of its tries.
	mark := max(4*s.poll, 200*time.Millisecond)
	deadline := time.Now().Add(maxWait)
	for {
		ok, err := acquireScript.Run(ctx, s.rdb, []string{s.key}, member, group, s.limit, s.groupLimit,
			s.lease.Milliseconds(), mark.Milliseconds()).Int()
		if err != nil {
			return nil, fmt.Errorf("acquire %s permit for %s: %w", s.key, group, err)
		}
		if ok == 1 {
			p := &Permit{s: s, member: member, stop: make(chan struct{}), done: make(chan struct{}), lost: make(chan struct{})}
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
			ok, err := renewScript.Run(ctx, p.s.rdb, []string{p.s.key}, p.member, p.s.lease.Milliseconds()).Int()
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
	if err := p.s.rdb.ZRem(ctx, p.s.key, p.member).Err(); err != nil {
		return fmt.Errorf("release %s permit: %w", p.s.key, err)
	}
	return nil
}
