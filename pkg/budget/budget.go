// Package budget is the monthly budgets at the door: what each tenant has
// used this UTC calendar month, in tokens and in spend, counted in Redis
// so that every API instance checks one figure in one script call.
//
// A request is charged its upper bound before anything starts (Reserve:
// its prompt's bound and every output token it may produce, priced at the
// dearest model that may answer in its pool) and settled with what it
// really used, priced at the model that answered, when it ends (Settle,
// exactly once by request id). What it used beyond its reservation is
// charged too, and reported as an overrun (Settlement). The usage ledger (pkg/usage) is
// the account; the counter is a fast copy of it: a month's counter that
// Redis does not hold (lost, or a new month) is rebuilt from the ledger
// before the first check, once however many requests race to it.
//
// Spend is counted in whole micro-dollars. A price in US dollars per
// million tokens is, conveniently, micro-dollars per token.
package budget

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/reserve.lua
	reserveLua string
	//go:embed lua/settle.lua
	settleLua string

	reserveScript = redis.NewScript(reserveLua)
	settleScript  = redis.NewScript(settleLua)
)

// Limit is a tenant's monthly budget; a zero field is no limit.
type Limit struct {
	Tokens int64
	Micros int64
}

// On reports whether any limit is set.
func (l Limit) On() bool { return l.Tokens > 0 || l.Micros > 0 }

// MicrosOf is a budget in US dollars as micro-dollars (whole, rounded down,
// so that a limit never grows by rounding).
func MicrosOf(usd float64) int64 { return int64(math.Floor(usd * 1e6)) }

// USD is micro-dollars as dollars.
func USD(micros int64) float64 { return float64(micros) / 1e6 }

// Used is a month's usage: tokens and micro-dollars.
type Used struct {
	Tokens int64
	Micros int64
}

// Kinds of limit, as refusals, warnings and metrics name them.
const (
	KindTokens = "tokens"
	KindSpend  = "spend"
)

// WarnRatio is the share of a limit whose first crossing in a month is
// reported (Decision.Warn).
const WarnRatio = 0.8

// Charge is one request's upper bound.
type Charge struct {
	Tenant    string
	RequestID string
	// PromptTokens and OutputTokens bound what it may use; Price prices
	// them (and, at Settle, what it used).
	PromptTokens int64
	OutputTokens int64
	Price        Price
}

// Decision is the outcome of Reserve.
type Decision struct {
	Allowed bool
	// Refused names the limit that refused (KindTokens, KindSpend).
	Refused string
	// Used is the month's usage after the decision, open reservations
	// included.
	Used  Used
	Limit Limit
	// ResetsAt is when the month ends: the start of the next, UTC.
	ResetsAt time.Time
	// Warn names the kinds this charge took past WarnRatio of their limit,
	// first in the month.
	Warn []string
	// Reservation is what Settle needs (empty when nothing was charged).
	Reservation string
}

// Rebuild reads a tenant's usage over [from, to) from the ledger.
type Rebuild func(ctx context.Context, tenant string, from, to time.Time) (Used, error)

// Counter reserves and settles budgets in Redis.
type Counter struct {
	rdb     redis.UniversalClient
	prefix  string
	rebuild Rebuild
	prices  Prices
	now     func() time.Time
}

// Options configure a Counter.
type Options struct {
	// KeyPrefix namespaces the keys ("sluice:").
	KeyPrefix string
	// Rebuild reads the ledger when a month's counter is missing; nil
	// starts it from zero (a process that only settles needs none).
	Rebuild Rebuild
	// Prices price what a request may use and what it used.
	Prices Prices
	// Now is the clock that picks the month (time.Now).
	Now func() time.Time
}

// New returns a Counter.
func New(rdb redis.UniversalClient, opts Options) *Counter {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Counter{rdb: rdb, prefix: opts.KeyPrefix, rebuild: opts.Rebuild, prices: opts.Prices, now: opts.Now}
}

// Prices are the counter's prices.
func (c *Counter) Prices() Prices { return c.prices }

// Month is the UTC calendar month of t: its start and the next's.
func Month(t time.Time) (start, next time.Time) {
	t = t.UTC()
	start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	return start, start.AddDate(0, 1, 0)
}

// keyspace versions the key layout. Each key carries the tenant's hash
// tag, the limiter's (limiter.TenantGroup), so that on Redis Cluster a
// tenant's budget and rate limits share a slot.
const keyspace = "bg1:"

// keepAfter is how long a month's counter outlives its month: requests
// running across midnight settle into the month that charged them.
const keepAfter = 8 * 24 * time.Hour

func (c *Counter) key(tenant string, month time.Time) string {
	return c.prefix + keyspace + "{t:" + tenant + "}:" + month.Format("2006-01")
}

// Reserve charges ch's upper bound against lim for the current month, or
// refuses it. With no limit set it charges nothing and calls nothing.
func (c *Counter) Reserve(ctx context.Context, ch Charge, lim Limit) (Decision, error) {
	start, next := Month(c.now())
	d := Decision{Limit: lim, ResetsAt: next}
	if !lim.On() {
		d.Allowed = true
		return d, nil
	}
	key := c.key(ch.Tenant, start)
	if strings.ContainsAny(key+ch.RequestID, "\n\r") {
		return d, fmt.Errorf("reserve budget for %s: a tenant or request id may not contain a line break", ch.RequestID)
	}
	tokens := ch.PromptTokens + ch.OutputTokens
	micros := int64(math.Ceil(float64(ch.PromptTokens)*ch.Price.Input + float64(ch.OutputTokens)*ch.Price.Output))
	args := []any{ch.RequestID, tokens, micros, lim.Tokens, lim.Micros, next.Add(keepAfter).UnixMilli(), "0", 0, 0}
	reply, err := c.run(ctx, key, args)
	if err == nil && reply.status == 0 {
		var u Used
		if c.rebuild != nil {
			if u, err = c.rebuild(ctx, ch.Tenant, start, next); err != nil {
				return d, fmt.Errorf("reserve budget for %s: rebuild %s's month from the ledger: %w", ch.RequestID, ch.Tenant, err)
			}
		}
		args[6], args[7], args[8] = "1", u.Tokens, u.Micros
		reply, err = c.run(ctx, key, args)
	}
	if err != nil {
		// The call may have charged before its reply was lost: the
		// reservation settles whatever it took.
		d.Reservation = encode(key, ch, "")
		return d, fmt.Errorf("reserve budget for %s: %w", ch.RequestID, err)
	}
	d.Used = Used{Tokens: reply.tokens, Micros: reply.micros}
	switch reply.status {
	case 1:
		d.Allowed = true
		d.Reservation = encode(key, ch, reply.epoch)
		if reply.warnTokens {
			d.Warn = append(d.Warn, KindTokens)
		}
		if reply.warnSpend {
			d.Warn = append(d.Warn, KindSpend)
		}
	case 2:
		d.Refused = KindTokens
	case 3:
		d.Refused = KindSpend
	default:
		return d, fmt.Errorf("reserve budget for %s: status %d", ch.RequestID, reply.status)
	}
	return d, nil
}

type reserveReply struct {
	status                int64
	tokens, micros        int64
	epoch                 string
	warnTokens, warnSpend bool
}

func (c *Counter) run(ctx context.Context, key string, args []any) (reserveReply, error) {
	raw, err := reserveScript.Run(ctx, c.rdb, []string{key}, args...).Slice()
	if err != nil {
		return reserveReply{}, err
	}
	if len(raw) != 6 {
		return reserveReply{}, fmt.Errorf("reply of %d values, want 6", len(raw))
	}
	var r reserveReply
	ints := make([]int64, 0, 5)
	for _, i := range []int{0, 1, 2, 4, 5} {
		n, ok := raw[i].(int64)
		if !ok {
			return reserveReply{}, fmt.Errorf("reply value %d is %T, want an integer", i, raw[i])
		}
		ints = append(ints, n)
	}
	r.status, r.tokens, r.micros = ints[0], ints[1], ints[2]
	r.warnTokens, r.warnSpend = ints[3] == 1, ints[4] == 1
	r.epoch, _ = raw[3].(string)
	return r, nil
}

// A reservation is text fit to carry in a workflow input: a version line,
// then the month's key, the request id, the key's epoch when charged and
// the prices.
const version = "b1"

func encode(key string, ch Charge, epoch string) string {
	return strings.Join([]string{version, key, ch.RequestID, epoch,
		strconv.FormatFloat(ch.Price.Input, 'g', -1, 64) + " " + strconv.FormatFloat(ch.Price.Output, 'g', -1, 64)}, "\n")
}

type reservation struct {
	key, id, epoch string
	price          Price
}

func decode(s string) (reservation, error) {
	f := strings.Split(s, "\n")
	if len(f) != 5 || f[0] != version {
		return reservation{}, fmt.Errorf("not a budget reservation: %.40q", s)
	}
	in, out, ok := strings.Cut(f[4], " ")
	pi, err1 := strconv.ParseFloat(in, 64)
	po, err2 := strconv.ParseFloat(out, 64)
	if !ok || err1 != nil || err2 != nil {
		return reservation{}, fmt.Errorf("not a budget reservation: bad prices %q", f[4])
	}
	return reservation{key: f[1], id: f[2], epoch: f[3], price: Price{Input: pi, Output: po}}, nil
}

// Use is what a request used: its tokens, and where it was answered,
// which prices them (Prices.At). An empty Pool prices them as the
// reservation was charged (a request that used nothing, or one settled by
// a caller that does not know where it was answered).
type Use struct {
	PromptTokens, CompletionTokens int64
	Pool, Model                    string
}

// Settlement is what Settle did.
type Settlement struct {
	// Settled is false when there was nothing to settle.
	Settled bool
	// Tenant is the reservation's.
	Tenant string
	// OverTokens and OverMicros are what the request used beyond what was
	// reserved for it: charged to the month all the same (the counter
	// follows the ledger), and an overrun its caller reports. Zero when
	// the reservation was lost with its month's counter (Redis lost it).
	OverTokens, OverMicros int64
}

// Settle replaces a reservation with what its request used, u. It
// settles at most once; an empty reservation settles nothing.
// Settle(r, Use{}) gives a charge back.
func (c *Counter) Settle(ctx context.Context, reservation string, u Use) (Settlement, error) {
	if reservation == "" {
		return Settlement{}, nil
	}
	r, err := decode(reservation)
	if err != nil {
		return Settlement{}, fmt.Errorf("settle budget: %w", err)
	}
	if u.PromptTokens < 0 || u.CompletionTokens < 0 {
		return Settlement{}, errors.New("settle budget: negative usage")
	}
	price := r.price
	if u.Pool != "" {
		price = c.prices.At(u.Pool, u.Model)
	}
	raw, err := settleScript.Run(ctx, c.rdb, []string{r.key}, r.id, r.epoch,
		u.PromptTokens+u.CompletionTokens, price.Micros(u.PromptTokens, u.CompletionTokens)).Int64Slice()
	if err != nil {
		return Settlement{}, fmt.Errorf("settle budget of %s: %w", r.id, err)
	}
	if len(raw) != 3 {
		return Settlement{}, fmt.Errorf("settle budget of %s: reply of %d values, want 3", r.id, len(raw))
	}
	return Settlement{Settled: raw[0] == 1, Tenant: tenantOf(r.key), OverTokens: raw[1], OverMicros: raw[2]}, nil
}

// tenantOf is the tenant of a month's key (Counter.key).
func tenantOf(key string) string {
	_, rest, _ := strings.Cut(key, "{t:")
	tenant, _, _ := strings.Cut(rest, "}:")
	return tenant
}
