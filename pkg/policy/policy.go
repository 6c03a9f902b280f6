// Package policy holds the live traffic policy — the limit tiers (rates,
// weights, waits, caps) and each pool's concurrency — and shares it
// between every API and worker instance through Redis. It starts from a
// base policy (the configuration file's, whose limits.* are this
// package's types); an operator changes it at run time through the admin
// API, and every instance picks the change up within its poll interval.
// The package owns the policy's rules too (Deployment.Validate), which
// the file's policy and every later one are held to alike.
package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/request"
)

// Policy is one version of the live policy.
type Policy struct {
	// Version grows with every change; 0 is the base policy's.
	Version int64
	// Epoch names the Redis the version counter lives in (set when the
	// first policy is put there): a Redis that restarted empty counts
	// versions from 1 again, and a policy of another epoch replaces the
	// current one whatever their versions.
	Epoch  string
	Limits Limits
	// Pools is each pool's permit count.
	Pools map[string]int
	// LongCostFactor multiplies the token charge of a request routed to
	// the long pool at the door (0 or 1: charged as any request). The
	// healer raises it to throttle long requests, which hold a batch's
	// KV cache longest, while it heals.
	LongCostFactor float64
}

// ChargeFactor is what a request routed to pool is charged against token
// rate limits, as a multiple of its tokens.
func (p *Policy) ChargeFactor(pool string) float64 {
	if pool == request.PoolLong && p.LongCostFactor > 1 {
		return p.LongCostFactor
	}
	return 1
}

// clone is a deep copy of p, to change without touching the original
// (which other goroutines read).
func (p *Policy) clone() Policy {
	out := *p
	out.Pools = make(map[string]int, len(p.Pools))
	for k, v := range p.Pools {
		out.Pools[k] = v
	}
	out.Limits.Tiers = make(map[string]Tier, len(p.Limits.Tiers))
	for k, v := range p.Limits.Tiers {
		v.Classes = maps.Clone(v.Classes)
		out.Limits.Tiers[k] = v
	}
	return out
}

// Tier returns the named tier (the default tier for ""), and its name.
func (p *Policy) Tier(name string) (Tier, string) {
	if name == "" {
		name = p.Limits.DefaultTier
	}
	return p.Limits.Tiers[name], name
}

// checkPools checks that p gives exactly the pools a request is routed to
// their permit counts.
func checkPools(p Policy) error {
	if len(p.Pools) != len(request.Pools()) {
		return errPools
	}
	for _, name := range request.Pools() {
		if _, ok := p.Pools[name]; !ok {
			return errPools
		}
	}
	return nil
}

var errPools = errors.New("invalid policy: pools must name exactly short and long")

// PoolLimiter applies a pool's permit count (the admission gate).
type PoolLimiter interface {
	SetLimit(ctx context.Context, pool string, n int) error
}

// Options configure a Store.
type Options struct {
	// KeyPrefix starts the store's Redis keys.
	KeyPrefix string
	// Base is the policy in force until one is shared, and again when
	// Redis loses the shared one: the configuration file's.
	Base Policy
	// Gate applies a new policy's permit counts.
	Gate PoolLimiter
	// Validate checks a policy before it is put or adopted, after its
	// pools are checked: a Deployment's Check, or nil to check nothing
	// more. Its errors reach the operator who put the policy.
	Validate func(Policy) error
	Logger   *slog.Logger
}

// Store is this process's view of the live policy.
type Store struct {
	rdb      redis.UniversalClient
	key      string
	base     Policy
	gate     PoolLimiter
	validate func(Policy) error
	logger   *slog.Logger
	cur      atomic.Pointer[Policy]
}

// NewStore starts from opts.Base; Run replaces it with the shared policy.
func NewStore(rdb redis.UniversalClient, opts Options) *Store {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Store{rdb: rdb, key: opts.KeyPrefix + "policy", base: opts.Base.clone(), gate: opts.Gate, validate: opts.Validate, logger: opts.Logger}
	p := s.base.clone()
	s.cur.Store(&p)
	return s
}

// check is what Put and Refresh require of a policy.
func (s *Store) check(p Policy) error {
	if err := checkPools(p); err != nil {
		return err
	}
	if s.validate == nil {
		return nil
	}
	return s.validate(p)
}

// Current is the policy in force. Callers must not modify it.
func (s *Store) Current() *Policy { return s.cur.Load() }

// document is the stored and the admin API's form of a Policy.
type document struct {
	Version     int64                   `json:"version"`
	Epoch       string                  `json:"epoch,omitempty"`
	Enabled     bool                    `json:"enabled"`
	DefaultTier string                  `json:"default_tier"`
	Tiers       map[string]tierDocument `json:"tiers"`
	Pools       map[string]poolDocument `json:"pools"`
	// LongCostFactor is absent (0) when long requests are charged as any.
	LongCostFactor float64 `json:"long_cost_factor,omitempty"`
}

type tierDocument struct {
	Tier
	MaxWait string                   `json:"max_wait,omitempty"`
	Classes map[string]classDocument `json:"classes,omitempty"`
}

type poolDocument struct {
	MaxConcurrency int `json:"max_concurrency"`
}

// MarshalJSON writes the admin API's form (durations as "30s").
func (p Policy) MarshalJSON() ([]byte, error) {
	d := document{Version: p.Version, Epoch: p.Epoch, Enabled: p.Limits.Enabled, DefaultTier: p.Limits.DefaultTier,
		Tiers: map[string]tierDocument{}, Pools: map[string]poolDocument{}, LongCostFactor: p.LongCostFactor}
	for name, t := range p.Limits.Tiers {
		td := tierDocument{Tier: t, Classes: classDocuments(t.Classes)}
		if t.MaxWait > 0 {
			td.MaxWait = t.MaxWait.String()
		}
		d.Tiers[name] = td
	}
	for name, n := range p.Pools {
		d.Pools[name] = poolDocument{MaxConcurrency: n}
	}
	return json.Marshal(d)
}

// UnmarshalJSON reads the admin API's form.
func (p *Policy) UnmarshalJSON(b []byte) error {
	var d document
	if err := json.Unmarshal(b, &d); err != nil {
		return err
	}
	out := Policy{Version: d.Version, Epoch: d.Epoch, Limits: Limits{Enabled: d.Enabled, DefaultTier: d.DefaultTier, Tiers: map[string]Tier{}},
		Pools: map[string]int{}, LongCostFactor: d.LongCostFactor}
	names := make([]string, 0, len(d.Tiers))
	for name := range d.Tiers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		td := d.Tiers[name]
		t := td.Tier
		if td.MaxWait != "" {
			w, err := time.ParseDuration(td.MaxWait)
			if err != nil {
				return fmt.Errorf("tiers.%s.max_wait: want a duration such as 30s: %w", name, err)
			}
			t.MaxWait = w
		}
		classes, err := classesOf("tiers."+name, td.Classes)
		if err != nil {
			return err
		}
		t.Classes = classes
		out.Limits.Tiers[name] = t
	}
	for name, pd := range d.Pools {
		out.Pools[name] = pd.MaxConcurrency
	}
	*p = out
	return nil
}

// Put validates and publishes a new policy for every instance, applies the
// pools' permit counts at once, and returns it with its new version.
func (s *Store) Put(ctx context.Context, p Policy) (Policy, error) {
	if err := s.check(p); err != nil {
		return Policy{}, err
	}
	v, epoch, err := s.nextVersion(ctx)
	if err != nil {
		return Policy{}, fmt.Errorf("publish policy: %w", err)
	}
	p.Version, p.Epoch = v, epoch
	raw, err := json.Marshal(p)
	if err != nil {
		return Policy{}, err
	}
	if err := s.rdb.Set(ctx, s.key, raw, 0).Err(); err != nil {
		return Policy{}, fmt.Errorf("publish policy: %w", err)
	}
	for pool, n := range p.Pools {
		if err := s.gate.SetLimit(ctx, pool, n); err != nil {
			return Policy{}, err
		}
	}
	s.adopt(&p)
	return p, nil
}

// Update changes the shared policy with change, starting from the newest
// one (it refreshes first), and puts the result. change returns false to
// leave the policy as it is (nothing is written). Two updates racing on
// different instances can still lose one of them: the last Put wins, as
// with the admin API.
func (s *Store) Update(ctx context.Context, change func(p *Policy) bool) (Policy, error) {
	if err := s.Refresh(ctx); err != nil {
		return Policy{}, err
	}
	p := s.Current().clone()
	if !change(&p) {
		return p, nil
	}
	return s.Put(ctx, p)
}

// nextVersion takes the next version number, and the epoch of the Redis
// that counts them (created with the counter).
func (s *Store) nextVersion(ctx context.Context) (int64, string, error) {
	epoch := strconv.FormatInt(time.Now().UnixNano(), 36)
	pipe := s.rdb.TxPipeline()
	pipe.SetNX(ctx, s.epochKey(), epoch, 0)
	get := pipe.Get(ctx, s.epochKey())
	incr := pipe.Incr(ctx, s.versionKey())
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, "", err
	}
	return incr.Val(), get.Val(), nil
}

// Key layout: the policy document, and its version counter with the
// counter's epoch, which one transaction takes together and so share a
// Redis Cluster hash tag:
//
//	<prefix>policy                   the policy in force (JSON)
//	<prefix>policy:{policy}:version  counter
//	<prefix>policy:{policy}:epoch    when the counter started
//
// The counter had no tag before (policy:version, policy:epoch): after an
// upgrade it starts again at 1 in a new epoch, which every instance takes
// as newer than the stored policy's (as after a Redis that restarted
// empty), and the stored policy stays in force until the next Put.
func (s *Store) versionKey() string { return s.key + ":{policy}:version" }
func (s *Store) epochKey() string   { return s.key + ":{policy}:epoch" }

// Refresh loads the shared policy if it is newer than the current one. If
// Redis lost it (it restarted empty), every instance goes back to the
// base policy rather than keep one nobody shares.
func (s *Store) Refresh(ctx context.Context) error {
	raw, err := s.rdb.Get(ctx, s.key).Bytes()
	if errors.Is(err, redis.Nil) {
		if s.Current().Version != 0 {
			p := s.base.clone()
			s.logger.Warn("the shared traffic policy is gone from Redis; back to the configuration's", "was", s.Current().Version)
			s.cur.Store(&p)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read policy: %w", err)
	}
	var p Policy
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("decode stored policy: %w", err)
	}
	if !newer(&p, s.Current()) {
		return nil
	}
	if err := s.check(p); err != nil {
		// Another build may have written it; keep what works here.
		return fmt.Errorf("stored policy v%d is invalid here: %w", p.Version, err)
	}
	s.adopt(&p)
	return nil
}

func (s *Store) adopt(p *Policy) {
	for {
		cur := s.cur.Load()
		if !newer(p, cur) && cur.Version != 0 {
			return
		}
		if s.cur.CompareAndSwap(cur, p) {
			s.logger.Info("traffic policy in force", "version", p.Version)
			return
		}
	}
}

// newer reports whether p should replace cur: a later version of the same
// epoch, or any version of another (a restarted Redis).
func newer(p, cur *Policy) bool {
	if p.Epoch != cur.Epoch && cur.Version != 0 {
		return true
	}
	return p.Version > cur.Version
}

// Run refreshes the policy every interval until ctx ends.
func (s *Store) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := s.Refresh(ctx); err != nil && ctx.Err() == nil {
			s.logger.Warn("refresh traffic policy", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
