// Package ban turns away abusive clients: an IP or an API key that earns
// more than a threshold of strikes within a sliding window is banned for
// a while, on every API instance at once (the ban lives in Redis). A
// strike is what abuse looks like, never an admitted request: a refused
// credential, or a request that comes back while a Retry-After it was
// given is still in force. A client within its plan, whatever its rate,
// earns none; one that honours its Retry-After earns none either. Checking
// a request costs one round trip; striking, one script call.
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

	"github.com/sluice-dev/sluice/pkg/hashtag"
	"github.com/sluice-dev/sluice/pkg/iphash"
)

var (
	//go:embed lua/strike.lua
	strikeLua    string
	strikeScript = redis.NewScript(strikeLua)
)

// Kind is what a ban names.
type Kind string

// The kinds of subject: a client address (an IPv6 client's /64, which is
// what one host is usually given) by its keyed hash (iphash), and an API
// key by its public id.
const (
	KindIP  Kind = "ip"
	KindKey Kind = "key"
)

// Options configure a Guard.
type Options struct {
	// KeyPrefix starts every Redis key (redis.key_prefix).
	KeyPrefix string
	// More than Threshold strikes within Window ban their subject for
	// Duration.
	Threshold int
	Window    time.Duration
	Duration  time.Duration
	// Grace is how long after a subject is first told to wait its
	// requests still count as already on their way (sent before the
	// refusal could reach the client) rather than as ignoring it; 0 is
	// DefaultGrace.
	Grace time.Duration
	// Exempt are networks whose addresses are never counted or banned,
	// such as a local proxy's.
	Exempt []netip.Prefix
	// Addresses names client addresses in keys and in the list; nil
	// hashes with the public development key.
	Addresses *iphash.Hasher
}

// DefaultGrace covers a client's requests in flight when its first
// refusal went out: a burst of concurrent requests all refused at once is
// not a client ignoring its Retry-After.
const DefaultGrace = time.Second

// Guard counts strikes and keeps the bans.
type Guard struct {
	rdb  redis.UniversalClient
	opts Options
	// splits: rdb sends each subject's keys to its own slot's server, so
	// that a request's subjects are counted one call each.
	splits bool
}

// New returns a Guard.
func New(rdb redis.UniversalClient, opts Options) (*Guard, error) {
	if opts.Threshold <= 0 || opts.Window < time.Millisecond || opts.Duration < time.Millisecond || opts.Grace < 0 {
		return nil, fmt.Errorf("ban: needs a threshold > 0, a window, a duration and a grace >= 0, got %+v", opts)
	}
	if opts.Grace == 0 {
		opts.Grace = DefaultGrace
	}
	return &Guard{rdb: rdb, opts: opts, splits: hashtag.Splits(rdb)}, nil
}

// Verdict is what a request learns from Check, Strike or Refused.
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

// IP is the subject of a client address: the hash of the address, or of
// an IPv6 address's /64; the zero Subject for an exempt or unparsable
// address, which is not counted.
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
	return g.addressSubject(ip)
}

// ForwardedIP is the subject of a client address that a trusted proxy
// named (X-Forwarded-For), as IP's but never exempt: an exemption is for
// a connection's own address, which a proxy not listed as trusted makes
// every client's; a forwarded address is one client's, and whoever
// reaches a trusted proxy's network can write any address there,
// loopback included.
func (g *Guard) ForwardedIP(addr string) Subject {
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return Subject{}
	}
	return g.addressSubject(ip.Unmap())
}

func (g *Guard) addressSubject(ip netip.Addr) Subject {
	return Subject{Kind: KindIP, Value: g.opts.Addresses.Addr(iphash.Client(ip))}
}

// Check says whether one of the subjects given (zero ones are skipped)
// is banned: one round trip, counting nothing.
func (g *Guard) Check(ctx context.Context, subjects ...Subject) (Verdict, error) {
	subjects = present(subjects)
	if len(subjects) == 0 {
		return Verdict{}, nil
	}
	pipe := g.rdb.Pipeline()
	left := make([]*redis.DurationCmd, len(subjects))
	for i, s := range subjects {
		left[i] = pipe.PTTL(ctx, g.banKey(s))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return Verdict{}, fmt.Errorf("check bans: %w", err)
	}
	for i, s := range subjects {
		if d := left[i].Val(); d > 0 {
			return Verdict{Banned: true, Kind: s.Kind, Value: s.Value, RetryAfter: d}, nil
		}
	}
	return Verdict{}, nil
}

// Strike counts a refused credential against each subject given and says
// whether one of them is (now) banned.
func (g *Guard) Strike(ctx context.Context, subjects ...Subject) (Verdict, error) {
	return g.strike(ctx, -1, 0, subjects)
}

// Refused tells the subjects of a request refused with retryAfter (a
// rate limit's 429) to wait that long, and counts a strike against each
// that was told to wait more than Options.Grace ago and came back before
// its wait ran out. It says whether one of them is (now) banned.
func (g *Guard) Refused(ctx context.Context, retryAfter time.Duration, subjects ...Subject) (Verdict, error) {
	return g.strike(ctx, g.opts.Grace, max(retryAfter, time.Millisecond), subjects)
}

// strike runs strike.lua. On a single Redis it is one call for all the
// subjects and the index. On a cluster each subject is counted by a call
// of its own, in order, so a request whose second subject is banned has
// counted against the first (a single call checks every ban before it
// counts), and a ban imposed there is added to the index by a second
// command: if that fails, the ban holds but List misses it, and strike
// returns the verdict with the error.
func (g *Guard) strike(ctx context.Context, grace, notice time.Duration, subjects []Subject) (Verdict, error) {
	counted := present(subjects)
	if len(counted) == 0 {
		return Verdict{}, nil
	}
	calls := [][]Subject{counted}
	if g.splits {
		calls = calls[:0]
		for _, s := range counted {
			calls = append(calls, []Subject{s})
		}
	}
	graceMs := int64(-1)
	if grace >= 0 {
		graceMs = grace.Milliseconds()
	}
	for _, call := range calls {
		keys := make([]string, 0, 3*len(call)+1)
		args := []any{g.opts.Threshold, g.opts.Window.Milliseconds(), g.opts.Duration.Milliseconds(), graceMs, notice.Milliseconds()}
		for _, s := range call {
			keys = append(keys, g.counterKey(s), g.banKey(s), g.noticeKey(s))
			args = append(args, s.member())
		}
		indexed := !g.splits
		if indexed {
			keys = append(keys, g.indexKey())
		}
		res, err := strikeScript.Run(ctx, g.rdb, keys, args...).Int64Slice()
		if err != nil {
			return Verdict{}, fmt.Errorf("count strike for bans: %w", err)
		}
		if len(res) != 4 || res[0] < 1 || int(res[0]) > len(call) {
			continue
		}
		s := call[res[0]-1]
		v := Verdict{Banned: true, Kind: s.Kind, Value: s.Value, RetryAfter: time.Duration(res[1]) * time.Millisecond, New: res[2] == 1}
		if v.New && !indexed {
			if err := g.rdb.ZAdd(ctx, g.indexKey(), redis.Z{Score: float64(res[3]), Member: s.member()}).Err(); err != nil {
				return v, fmt.Errorf("list the new ban of %s %s: %w", s.Kind, s.Value, err)
			}
		}
		return v, nil
	}
	return Verdict{}, nil
}

// present are the subjects that name something (an exempt or unparsable
// address is the zero Subject).
func present(subjects []Subject) []Subject {
	out := make([]Subject, 0, len(subjects))
	for _, s := range subjects {
		if s.Value != "" {
			out = append(out, s)
		}
	}
	return out
}

// Key layout: a subject's ban, strike counter and notice share its hash
// tag, so that striking it is one script call on Redis Cluster too; the
// index of bans is one key of its own. An address's value is its hash
// (Guard.IP), never the address; changing the hash key forgets the bans
// in force and the counts.
//
//	<prefix>ban:{<kind>:<value>}       the ban: its start (ms), expiring with it
//	<prefix>ban:{<kind>:<value>}:n     the subject's strike counter (strike.lua)
//	<prefix>ban:{<kind>:<value>}:told  when it was told to wait (ms), expiring with the wait
//	<prefix>bans                       zset of the bans: "<kind>:<value>" -> end (ms)
func (g *Guard) indexKey() string            { return g.opts.KeyPrefix + "bans" }
func (g *Guard) banKey(s Subject) string     { return g.opts.KeyPrefix + "ban:{" + s.member() + "}" }
func (g *Guard) counterKey(s Subject) string { return g.banKey(s) + ":n" }
func (g *Guard) noticeKey(s Subject) string  { return g.banKey(s) + ":told" }

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

// Lift ends a ban at once; false if there was none. The ban and the
// counter go together (one slot); the index entry after them, since List
// drops an entry whose ban is gone anyway.
func (g *Guard) Lift(ctx context.Context, s Subject) (bool, error) {
	pipe := g.rdb.TxPipeline()
	del := pipe.Del(ctx, g.banKey(s))
	pipe.Del(ctx, g.counterKey(s), g.noticeKey(s)) // a fresh start, not one strike short of a new ban
	if _, err := pipe.Exec(ctx); err != nil {
		return false, fmt.Errorf("lift ban of %s %s: %w", s.Kind, s.Value, err)
	}
	if err := g.rdb.ZRem(ctx, g.indexKey(), s.member()).Err(); err != nil {
		return false, fmt.Errorf("lift ban of %s %s: drop it from the index: %w", s.Kind, s.Value, err)
	}
	return del.Val() > 0, nil
}

// ParseSubject reads a kind and value given by an operator. An address
// may be given as it is (hashed here, an IPv6 one by its /64, as it is
// counted) or as the hash List shows.
func (g *Guard) ParseSubject(kind, value string) (Subject, error) {
	switch Kind(kind) {
	case KindIP:
		if iphash.IsHash(value) {
			return Subject{Kind: KindIP, Value: value}, nil
		}
		ip, err := netip.ParseAddr(value)
		if err != nil {
			return Subject{}, fmt.Errorf("ip ban: %q is neither an IP address nor the %d-hex-digit hash the ban list shows", value, iphash.Len)
		}
		return g.addressSubject(ip), nil
	case KindKey:
		if value == "" || len(value) > 64 || strings.ContainsAny(value, ": \t\r\n") {
			return Subject{}, fmt.Errorf("key ban: %q is not a key id", value)
		}
		return Subject{Kind: KindKey, Value: value}, nil
	}
	return Subject{}, fmt.Errorf("unknown ban kind %q (want ip or key)", kind)
}
