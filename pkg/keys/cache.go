package keys

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

// ErrUnknown is a key that names no managed key, or whose secret is
// wrong; ErrRevoked is a revoked one. Callers tell a client only that the
// key is not accepted.
var (
	ErrUnknown = errors.New("unknown API key")
	ErrRevoked = errors.New("revoked API key")
)

// Cache verifies managed keys for one API process without a Redis round
// trip per request, and still stops honouring a revoked key within
// moments on every process: a revocation is published on the store's
// channel and drops the key here; entries also expire after TTL in case a
// message was lost; and while the subscription is down the cache is not
// trusted at all (every request reads Redis), since revocations sent
// meanwhile would be missed.
type Cache struct {
	store  *Store
	ttl    time.Duration
	touch  time.Duration
	now    func() time.Time
	logger *slog.Logger

	mu      sync.RWMutex
	entries map[string]*entry
	// epoch moves on every invalidation: a read from Redis that began
	// before one is not cached, so a revocation racing a load is not
	// undone by it.
	epoch atomic.Uint64
	// live is set while the invalidation channel is subscribed.
	live   atomic.Bool
	loads  singleflight.Group
	active sync.WaitGroup
}

type entry struct {
	key    Key
	loaded time.Time
	// touched is when this process last recorded the key's use (unix ns).
	touched atomic.Int64
}

// CacheOptions configure a Cache.
type CacheOptions struct {
	// TTL bounds how long a key read from Redis is trusted without news
	// from the channel (auth.key_cache_ttl).
	TTL time.Duration
	// TouchEvery is how often one process records a key's last use at
	// most. Default one minute.
	TouchEvery time.Duration
	Logger     *slog.Logger
}

// NewCache returns a Cache over store. Run must be running for it to
// cache anything.
func NewCache(store *Store, opts CacheOptions) *Cache {
	if opts.TTL <= 0 {
		opts.TTL = 10 * time.Second
	}
	if opts.TouchEvery <= 0 {
		opts.TouchEvery = time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Cache{store: store, ttl: opts.TTL, touch: opts.TouchEvery, now: time.Now, logger: opts.Logger, entries: map[string]*entry{}}
}

// Store is the store the cache reads.
func (c *Cache) Store() *Store { return c.store }

// Verify returns the managed key plain names, if it is valid and not
// revoked. Errors other than ErrMalformed, ErrUnknown and ErrRevoked mean
// Redis could not be read.
func (c *Cache) Verify(ctx context.Context, plain string) (Key, error) {
	id, err := ParseID(plain)
	if err != nil {
		return Key{}, err
	}
	e, err := c.lookup(ctx, id)
	if err != nil {
		return Key{}, err
	}
	if e == nil || subtle.ConstantTimeCompare([]byte(Hash(plain)), []byte(e.key.hash)) != 1 {
		return Key{}, ErrUnknown
	}
	if e.key.Revoked {
		return Key{}, ErrRevoked
	}
	c.touchIfDue(e)
	return e.key, nil
}

// lookup finds a key's entry in the cache or Redis; nil if there is no
// such key.
func (c *Cache) lookup(ctx context.Context, id string) (*entry, error) {
	now := c.now()
	if c.live.Load() {
		c.mu.RLock()
		e := c.entries[id]
		c.mu.RUnlock()
		if e != nil && now.Sub(e.loaded) < c.ttl {
			return e, nil
		}
	}
	v, err, _ := c.loads.Do(id, func() (any, error) {
		epoch := c.epoch.Load()
		k, ok, err := c.store.Get(ctx, id)
		if err != nil || !ok {
			// Unknown ids are not cached: the map would grow with every
			// guess, and the bans deal with whoever guesses.
			return (*entry)(nil), err
		}
		e := &entry{key: k, loaded: now}
		c.mu.Lock()
		if c.live.Load() && c.epoch.Load() == epoch {
			c.entries[id] = e
		}
		c.mu.Unlock()
		return e, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*entry), nil
}

// touchIfDue records the key's use in Redis at most once per TouchEvery
// per process, off the request's path.
func (c *Cache) touchIfDue(e *entry) {
	now := c.now()
	last := e.touched.Load()
	if now.UnixNano()-last < int64(c.touch) || !e.touched.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	c.active.Add(1)
	go func() {
		defer c.active.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := c.store.Touch(ctx, e.key.ID, now); err != nil {
			c.logger.Warn("record key use", "key_id", e.key.ID, "err", err)
		}
	}()
}

// Forget drops a key from this process's cache (the instance that
// revoked it does not wait for its own message).
func (c *Cache) Forget(id string) {
	c.mu.Lock()
	c.epoch.Add(1)
	delete(c.entries, id)
	c.mu.Unlock()
}

// flush drops every entry.
func (c *Cache) flush() {
	c.mu.Lock()
	c.epoch.Add(1)
	clear(c.entries)
	c.mu.Unlock()
}

// pingEvery is how long a quiet subscription waits before it asks Redis
// for a pong; a second silence with a ping unanswered means the connection
// died without a word (no reset), and the cache stops trusting itself.
const pingEvery = 5 * time.Second

// Run follows the invalidation channel until ctx ends. Each
// (re)subscription starts from an empty cache, as messages sent while it
// was down are lost; while it is down the cache is not trusted.
func (c *Cache) Run(ctx context.Context) {
	defer c.active.Wait()
	for {
		err := c.follow(ctx)
		c.live.Store(false)
		c.flush()
		if ctx.Err() != nil {
			return
		}
		c.logger.Warn("key invalidation channel lost; reading keys from Redis until it is back", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// follow subscribes and applies invalidations until the subscription
// fails or ctx ends.
func (c *Cache) follow(ctx context.Context) error {
	ps := c.store.rdb.Subscribe(ctx, c.store.Channel())
	defer ps.Close()
	// A blocked Receive does not watch its context; closing ends it.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(ctx, pingEvery)
		var nerr net.Error
		switch {
		case err != nil && errors.As(err, &nerr) && nerr.Timeout() && !pinged && ctx.Err() == nil:
			if err := ps.Ping(ctx); err != nil {
				return fmt.Errorf("ping the invalidation channel: %w", err)
			}
			pinged = true
			continue
		case err != nil:
			return err
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				c.flush()
				c.live.Store(true)
			}
		case *redis.Message:
			c.Forget(m.Payload)
		}
	}
}

// Live reports whether the cache is trusted (its channel is subscribed).
func (c *Cache) Live() bool { return c.live.Load() }
