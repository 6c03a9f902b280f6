// Package ban turns away clients that flood: an IP or an API key that
// sends more than a threshold of requests within a sliding window is
// banned for a while, on every API instance at once (the ban lives in
// Redis). Counting and checking cost one script call per request.
package ban

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/hit.lua
	hitLua    string
	hitScript = redis.NewScript(hitLua)
)

// Kind is what a ban names.
type Kind string

// The kinds of subject: a client address (an IPv6 client's /64, which is
// what one host is usually given), and an API key by its public id.
const (
	KindIP  Kind = "ip"
	KindKey Kind = "key"
)

// Options configure a Guard.
type Options struct {
	// KeyPrefix starts every Redis key (redis.key_prefix).
	KeyPrefix string
	// More than Threshold requests within Window ban their subject for
	// Duration.
	Threshold int
	Window    time.Duration
	Duration  time.Duration
	// Exempt are networks whose addresses are never counted or banned,
	// such as a local proxy's.
	Exempt []netip.Prefix
}

// Guard counts requests and keeps the bans.
type Guard struct {
	rdb  redis.UniversalClient
	opts Options
}

// New returns a Guard.
func New(rdb redis.UniversalClient, opts Options) (*Guard, error) {
	if opts.Threshold <= 0 || opts.Window < time.Millisecond || opts.Duration < time.Millisecond {
		return nil, fmt.Errorf("ban: needs a threshold > 0, a window and a duration, got %+v", opts)
	}
	return &Guard{rdb: rdb, opts: opts}, nil
}

// Verdict is what a request learns from Hit.
type Verdict struct {
	// Banned names the subject banned, if any.
	Banned bool
	Kind   Kind
	Value  string
	// RetryAfter is what is left of the ban.
	RetryAfter time.Duration
	// New is set when this very request imposed the ban.
	New bool
}

// Subject is one thing a ban can name.
type Subject struct {
	Kind  Kind
	Value string
}

func (s Subject) member() string { return string(s.Kind) + ":" + s.Value }

// IP is the subject of a client address: an IPv6 address by its /64; the
// zero Subject for an exempt or unparsable address, which is not counted.
func (g *Guard) IP(addr string) Subject {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return Subject{}
	}
	ip = ip.Unmap()
	for _, p := range g.opts.Exempt {
		if p.Contains(ip) {
			return Subject{}
		}
	}
	if ip.Is6() {
		ip = netip.PrefixFrom(ip, 64).Masked().Addr()
	}
	return Subject{Kind: KindIP, Value: ip.String()}
}

// Hit counts one request of each subject given (zero ones are skipped)
// and says whether one of them is banned.
func (g *Guard) Hit(ctx context.Context, subjects ...Subject) (Verdict, error) {
	keys := []string{g.indexKey()}
	args := []any{g.opts.Threshold, g.opts.Window.Milliseconds(), g.opts.Duration.Milliseconds()}
	var counted []Subject
	for _, s := range subjects {
		if s.Value == "" {
			continue
		}
		keys = append(keys, g.counterKey(s), g.banKey(s))
		counted = append(counted, s)
	}
	if len(counted) == 0 {
		return Verdict{}, nil
	}
	for _, s := range counted {
		args = append(args, s.member())
	}
	res, err := hitScript.Run(ctx, g.rdb, keys, args...).Int64Slice()
	if err != nil {
		return Verdict{}, fmt.Errorf("count request for bans: %w", err)
	}
	if len(res) != 3 || res[0] == 0 {
		return Verdict{}, nil
	}
	s := counted[res[0]-1]
	return Verdict{Banned: true, Kind: s.Kind, Value: s.Value, RetryAfter: time.Duration(res[1]) * time.Millisecond, New: res[2] == 1}, nil
}

func (g *Guard) indexKey() string            { return g.opts.KeyPrefix + "bans" }
func (g *Guard) banKey(s Subject) string     { return g.opts.KeyPrefix + "ban:" + s.member() }
func (g *Guard) counterKey(s Subject) string { return g.opts.KeyPrefix + "ban:n:" + s.member() }

// Ban is one ban in force.
type Ban struct {
	Kind  Kind      `json:"kind"`
	Value string    `json:"value"`
	Since time.Time `json:"since"`
	// Remaining is what is left of it.
	Remaining time.Duration `json:"-"`
}

// List returns the bans in force, the newest last, and forgets the index
// entries of bans that ended.
func (g *Guard) List(ctx context.Context) ([]Ban, error) {
	members, err := g.rdb.ZRange(ctx, g.indexKey(), 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("list bans: %w", err)
	}
	pipe := g.rdb.Pipeline()
	type read struct {
		s     Subject
		since *redis.StringCmd
		left  *redis.DurationCmd
	}
	reads := make([]read, 0, len(members))
	for _, m := range members {
		kind, value, _ := strings.Cut(m, ":")
		s := Subject{Kind: Kind(kind), Value: value}
		reads = append(reads, read{s, pipe.Get(ctx, g.banKey(s)), pipe.PTTL(ctx, g.banKey(s))})
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read %d bans: %w", len(members), err)
	}
	out := []Ban{}
	var ended []any
	for i, r := range reads {
		since, err := r.since.Int64()
		if err != nil || r.left.Val() <= 0 {
			ended = append(ended, members[i])
			continue
		}
		out = append(out, Ban{Kind: r.s.Kind, Value: r.s.Value, Since: time.UnixMilli(since).UTC(), Remaining: r.left.Val()})
	}
	if len(ended) > 0 {
		// A ban that ended a moment ago and is re-imposed meanwhile is
		// added back to the index by the script, after this removal, or
		// it is already re-listed in it under the same member: either
		// way it shows up in the next list.
		_ = g.rdb.ZRem(ctx, g.indexKey(), ended...).Err()
	}
	slices.SortStableFunc(out, func(a, b Ban) int { return a.Since.Compare(b.Since) })
	return out, nil
}

// Lift ends a ban at once; false if there was none.
func (g *Guard) Lift(ctx context.Context, s Subject) (bool, error) {
	pipe := g.rdb.TxPipeline()
	del := pipe.Del(ctx, g.banKey(s))
	pipe.Del(ctx, g.counterKey(s)) // a fresh start, not one request short of a new ban
	pipe.ZRem(ctx, g.indexKey(), s.member())
	if _, err := pipe.Exec(ctx); err != nil {
		return false, fmt.Errorf("lift ban of %s %s: %w", s.Kind, s.Value, err)
	}
	return del.Val() > 0, nil
}

// ParseSubject reads a kind and value given by an operator.
func ParseSubject(kind, value string) (Subject, error) {
	switch Kind(kind) {
	case KindIP:
		ip, err := netip.ParseAddr(value)
		if err != nil {
			return Subject{}, fmt.Errorf("ip ban: %q is not an IP address", value)
		}
		return Subject{Kind: KindIP, Value: ip.Unmap().String()}, nil
	case KindKey:
		if value == "" || len(value) > 64 || strings.ContainsAny(value, ": \t\r\n") {
			return Subject{}, fmt.Errorf("key ban: %q is not a key id", value)
		}
		return Subject{Kind: KindKey, Value: value}, nil
	}
	return Subject{}, fmt.Errorf("unknown ban kind %q (want ip or key)", kind)
}
