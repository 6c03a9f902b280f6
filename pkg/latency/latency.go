// Package latency keeps a rolling window of recent latencies and counts per
// series (a stage of a pool: "llm_first_token/short"), shared by every API
// and worker process through Redis, so that the healer reads P50, P99 and
// their ratio over all of them, not over the one it runs in.
//
// Recording is an atomic increment in a local histogram: the requests'
// hot path never waits for Redis. Each process flushes what it recorded
// every second in one script call, adding its bucket counts into a slot
// per (series, time slot), a string of counters that expires by itself;
// reading fetches the slots that overlap the window in one call and adds
// them up. Slots are numbered by Redis's clock, so processes whose clocks
// disagree still write into and read the same slots.
//
// What a reader sees lags what was recorded by up to one flush interval,
// and an observation is counted in the slot of the flush that carries it.
// A flush whose reply is lost may be applied and then sent again: at
// worst one flush's counts are counted twice.
//
// The healer reads a window (a minute) every few seconds with Snapshots:
// a stage's latencies and its outcome counters in one call. P99 of fewer
// than about a hundred latencies is one or two of them; a ratio read from
// so few is noise, not a signal.
//
// A flush and a read name several series' keys in one call, so every key
// of the window carries one Redis Cluster hash tag (see Keyspace): on a
// cluster the whole window is in one slot. It is small (series × slots of
// a few hundred bytes) and written once a second per process.
package latency

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/clock.lua
	clockLua string
	//go:embed lua/flush.lua
	flushLua string
	//go:embed lua/read.lua
	readLua string

	flushScript = redis.NewScript(clockLua + flushLua)
	readScript  = redis.NewScript(clockLua + readLua)
)

// Series names the series of a stage in a pool, "llm_first_token/short",
// so that the processes recording it and the healer reading it agree.
func Series(stage, pool string) string { return stage + "/" + pool }

// Options configures a Window.
type Options struct {
	// KeyPrefix namespaces the keys ("sluice:").
	KeyPrefix string
	// Slot is the window's resolution: a window is read as whole slots.
	// Default 10s.
	Slot time.Duration
	// Retention is the longest window Snapshot can read; slots are kept
	// this long after they end. Default 5m.
	Retention time.Duration
	// FlushEvery is how often Run sends what was recorded; at most Slot.
	// Default 1s (or Slot if shorter).
	FlushEvery time.Duration
	// Logger gets the flushes that failed. Default slog.Default().
	Logger *slog.Logger
}

// Window records latencies and counts locally and shares them through
// Redis. Record and Add are safe for concurrent use and never block.
type Window struct {
	rdb        redis.Scripter
	prefix     string
	slot       time.Duration
	retention  time.Duration
	flushEvery time.Duration
	logger     *slog.Logger
	// clock replaces Redis's clock in tests (and time.Now for the age of
	// what a failed flush kept); nil in production.
	clock func() time.Time

	// series maps a series name to its *local histogram; an entry is never
	// removed, so Record never has to check whether its entry is still in
	// use. Series are a fixed set (stages × pools).
	series sync.Map

	// flushing serializes flushes; it guards pending and pendingSince.
	flushing sync.Mutex
	// pending is what was taken from the local histograms and not yet
	// written, kept across failed flushes.
	pending      map[string]*pending
	pendingSince time.Time
}

// local is one series' observations since the last flush. Record adds to
// it with atomics and a flush swaps each field back to zero; an
// observation that races a flush may have its bucket in one flush and its
// share of the sum in the next, which moves the mean by nothing visible.
type local struct {
	buckets [numBuckets]atomic.Int64
	sumNs   atomic.Int64
	added   atomic.Int64
}

// pending is one series' observations taken for a flush.
type pending struct {
	buckets [numBuckets]int64
	sumNs   int64
	added   int64
}

// New returns a Window. Run it to share what it records.
func New(rdb redis.Scripter, opts Options) (*Window, error) {
	opts.Slot = cmp.Or(opts.Slot, 10*time.Second)
	opts.Retention = cmp.Or(opts.Retention, 5*time.Minute)
	opts.FlushEvery = cmp.Or(opts.FlushEvery, min(time.Second, opts.Slot))
	if opts.Slot < time.Millisecond || opts.Retention < opts.Slot || opts.FlushEvery < 0 || opts.FlushEvery > opts.Slot {
		return nil, fmt.Errorf("latency window: needs slot ≥ 1ms (got %v), retention ≥ slot (got %v) and flush interval ≤ slot (got %v)",
			opts.Slot, opts.Retention, opts.FlushEvery)
	}
	return &Window{
		rdb:        rdb,
		prefix:     opts.KeyPrefix + Keyspace + "{window}:",
		slot:       opts.Slot,
		retention:  opts.Retention,
		flushEvery: opts.FlushEvery,
		logger:     cmp.Or(opts.Logger, slog.Default()),
		pending:    map[string]*pending{},
	}, nil
}

// Record counts latency d in series. A negative d counts as zero.
//
// It takes no context: it does no I/O and cannot block, it only adds to
// this process's histogram, which Run sends on.
func (w *Window) Record(series string, d time.Duration) {
	l := w.local(series)
	l.buckets[bucketOf(d)].Add(1)
	l.sumNs.Add(int64(max(d, 0)))
}

// Add adds n to series' counter (outcomes: "llm_timeout/short"), read back
// as Stats.Added. Like Record it only touches this process's memory.
func (w *Window) Add(series string, n int64) {
	w.local(series).added.Add(n)
}

func (w *Window) local(series string) *local {
	if l, ok := w.series.Load(series); ok {
		return l.(*local)
	}
	l, _ := w.series.LoadOrStore(series, new(local))
	return l.(*local)
}

// Run flushes every FlushEvery until ctx ends, then flushes what is left
// (for at most max(FlushEvery, 1s)) and returns. A failed flush is logged
// and its counts go with the next one.
func (w *Window) Run(ctx context.Context) error {
	t := time.NewTicker(w.flushEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			// Let the last flush outlive ctx: ctx ending is why it runs.
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(w.flushEvery, time.Second))
			defer cancel()
			if err := w.Flush(fctx); err != nil {
				w.logger.Warn("last latency flush", "err", err)
			}
			return nil
		case <-t.C:
			// A flush slower than the interval is as good as failed; the
			// next one carries its counts.
			fctx, cancel := context.WithTimeout(ctx, w.flushEvery)
			err := w.Flush(fctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				w.logger.Warn("latency flush", "err", err)
			}
		}
	}
}

// ErrDropped is wrapped by a Flush that failed and gave up on counts that
// had been waiting for longer than a slot.
var ErrDropped = errors.New("dropped counts kept too long")

// Flush sends what was recorded since the last successful flush. If it
// fails, the counts are kept for the next flush, but not for longer than
// one slot: a flush adds into the current slot, and counts that old would
// make the window show a past that it no longer covers.
func (w *Window) Flush(ctx context.Context) error {
	w.flushing.Lock()
	defer w.flushing.Unlock()
	w.take()
	if len(w.pending) == 0 {
		return nil
	}
	keys := make([]string, 0, len(w.pending))
	args := []any{w.nowArg(), w.slot.Milliseconds(), w.retention.Milliseconds()}
	for name, p := range w.pending {
		keys = append(keys, w.key(name))
		args = p.appendIncrements(args)
	}
	err := flushScript.Run(ctx, w.rdb, keys, args...).Err()
	if err == nil {
		clear(w.pending)
		return nil
	}
	err = fmt.Errorf("flush latencies of %d series: %w", len(keys), err)
	if age := w.now().Sub(w.pendingSince); age > w.slot {
		var observations, added int64
		for _, p := range w.pending {
			for _, n := range p.buckets {
				observations += n
			}
			added += p.added
		}
		clear(w.pending)
		return fmt.Errorf("%w; %w: %d latencies and %d added over %d series, kept %v",
			err, ErrDropped, observations, added, len(keys), age.Round(time.Millisecond))
	}
	return err
}

// take moves the local histograms' counts into pending.
func (w *Window) take() {
	w.series.Range(func(name, l any) bool {
		loc := l.(*local)
		var p *pending
		get := func() *pending {
			if p == nil {
				if p = w.pending[name.(string)]; p == nil {
					p = new(pending)
					if len(w.pending) == 0 {
						w.pendingSince = w.now()
					}
					w.pending[name.(string)] = p
				}
			}
			return p
		}
		for i := range loc.buckets {
			// A load first: most buckets are empty, and a swap would take
			// their cache line from the recording cores.
			if loc.buckets[i].Load() != 0 {
				get().buckets[i] += loc.buckets[i].Swap(0)
			}
		}
		if loc.sumNs.Load() != 0 {
			get().sumNs += loc.sumNs.Swap(0)
		}
		if loc.added.Load() != 0 {
			get().added += loc.added.Swap(0)
		}
		return true
	})
}

// Snapshot merges series' slots over the last window from every process.
// It sees what has been flushed: not this process's last FlushEvery.
func (w *Window) Snapshot(ctx context.Context, series string, window time.Duration) (Stats, error) {
	s, err := w.Snapshots(ctx, window, series)
	if err != nil {
		return Stats{}, err
	}
	return s[0], nil
}

// Snapshots is Snapshot of several series in one call, in the order given
// (a timeout rate: timeouts and requests over the same slots).
func (w *Window) Snapshots(ctx context.Context, window time.Duration, series ...string) ([]Stats, error) {
	if window <= 0 || window > w.retention {
		return nil, fmt.Errorf("read latency window %v of %v: window must be in (0, retention %v]", window, series, w.retention)
	}
	keys := make([]string, len(series))
	for i, name := range series {
		keys[i] = w.key(name)
	}
	// EVALSHA_RO: a replica can serve it.
	reply, err := readScript.RunRO(ctx, w.rdb, keys, w.nowArg(), w.slot.Milliseconds(), window.Milliseconds()).Slice()
	if err != nil {
		return nil, fmt.Errorf("read latency window %v of %v: %w", window, series, err)
	}
	stats, err := parseRead(reply, len(series))
	if err != nil {
		return nil, fmt.Errorf("read latency window %v of %v: %w", window, series, err)
	}
	return stats, nil
}

func parseRead(reply []any, n int) ([]Stats, error) {
	if len(reply) != 2+n {
		return nil, fmt.Errorf("reply of %d values for %d series", len(reply), n)
	}
	now, ok1 := reply[0].(int64)
	from, ok2 := reply[1].(int64)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("reply starts with %T, %T", reply[0], reply[1])
	}
	stats := make([]Stats, n)
	for i := range stats {
		slots, ok := reply[2+i].([]any)
		if !ok {
			return nil, fmt.Errorf("series %d: %T", i, reply[2+i])
		}
		s := &stats[i]
		s.Span = time.Duration(now-from) * time.Millisecond
		var sum [slotFields]int64
		for _, slot := range slots {
			if slot == nil {
				continue
			}
			b, ok := slot.(string)
			if !ok || len(b)%8 != 0 || len(b) > 8*slotFields {
				return nil, fmt.Errorf("series %d: a slot of %T, %d bytes", i, slot, len(b))
			}
			for j := range len(b) / 8 {
				sum[j] += int64(binary.BigEndian.Uint64([]byte(b[8*j : 8*j+8])))
			}
		}
		s.Added = sum[addedField]
		s.Sum = time.Duration(sum[sumField]) * time.Microsecond
		s.hist = sum[firstBucketField:]
		for _, c := range s.hist {
			s.Count += c
		}
		s.P50, s.P90, s.P99 = s.Quantile(0.50), s.Quantile(0.90), s.Quantile(0.99)
	}
	return stats, nil
}

// A slot is slotFields big-endian int64 (BITFIELD's i64 #j): the sum of
// Add first, so that a counter's slot is 8 bytes; then the sum of the
// latencies in µs; then the bucket counts (lua/flush.lua).
const (
	addedField       = 0
	sumField         = 1
	firstBucketField = 2
	slotFields       = firstBucketField + numBuckets
)

// fieldOffset is BITFIELD's offset of each field.
var fieldOffset [slotFields]string

func init() {
	for j := range fieldOffset {
		fieldOffset[j] = "#" + strconv.Itoa(j)
	}
}

// appendIncrements appends p's flush arguments to args: k, then k
// BITFIELD arguments.
func (p *pending) appendIncrements(args []any) []any {
	at := len(args)
	args = append(args, 0)
	incr := func(field int, n int64) {
		if n != 0 {
			args = append(args, "INCRBY", "i64", fieldOffset[field], n)
		}
	}
	incr(addedField, p.added)
	// To the µs: the sum is for the mean, and µs keep a window of a busy
	// series' latencies far from overflowing.
	incr(sumField, (p.sumNs+500)/1000)
	for i, n := range p.buckets {
		incr(firstBucketField+i, n)
	}
	args[at] = len(args) - at - 1
	return args
}

// Keyspace names the keys with the version of their format (the slot
// layout): a process of another version never reads or adds into them.
// A slot's key is
//
//	<prefix>lat2:{window}:<series>:<slot number>
//
// one hash tag for every series, so that a flush or a read of several
// series is one script call on Redis Cluster too. (lat1 tagged each series
// alone; an upgrade starts the window empty: until it holds
// healing.min_samples latencies again, the healer ignores the ratio.)
const Keyspace = "lat2:"

// key is the base of a series' slot keys; the scripts append the slot
// number.
func (w *Window) key(series string) string { return w.prefix + series + ":" }

// nowArg is the scripts' clock argument: 0 for Redis's own.
func (w *Window) nowArg() int64 {
	if w.clock == nil {
		return 0
	}
	return w.clock().UnixMilli()
}

func (w *Window) now() time.Time {
	if w.clock == nil {
		return time.Now()
	}
	return w.clock()
}
