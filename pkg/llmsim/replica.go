package llmsim

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Finish reasons, as OpenAI and vLLM's finished_reason label spell them.
const (
	finishStop   = "stop"
	finishLength = "length"
	finishAbort  = "abort"
)

var (
	errServerClosed = errors.New("llm simulator is shutting down")
	errReplicaGone  = errors.New("replica is draining")
)

// maxCatchUp bounds how far, in simulated time, a replica may run steps
// back to back to make up for timers that woke late. Catching up keeps the
// simulated token rate right at tiny TimeScales, where a step is shorter
// than the timer resolution; the bound keeps a long stall from turning into
// a burst.
const maxCatchUp = time.Second

// event is what a sequence reports to the HTTP handler serving it: a token,
// or the end (done with a finish reason, or err), of the choice it writes.
type event struct {
	choice int
	text   string
	done   bool
	reason string
	err    error
}

// prompt is a request's prompt inside the engine. The request's sequences,
// one per choice, share it as vLLM's forked sequences do: it is prefilled
// once, and its full KV blocks are held once while any of them holds
// blocks. The last, partial block is each sequence's own, since each
// writes its first token into its copy. Its fields after tokens and
// shared change only under the lock of the replica holding the request.
type prompt struct {
	tokens int
	// shared is the number of full KV blocks the prompt fills.
	shared int
	// holders is how many of the sequences hold KV blocks; the shared
	// blocks are allocated while it is above zero.
	holders int
	// counted tells that the prompt's tokens are in the metrics, which
	// count them once per request.
	counted bool
}

func newPrompt(tokens, blockSize int) *prompt {
	return &prompt{tokens: tokens, shared: tokens / blockSize}
}

// sequence is one choice of a request inside the engine. The fields after
// unwatch change only under the lock of the replica holding the sequence.
type sequence struct {
	// ctx is the HTTP request's context: the client going away cancels it,
	// and the replica then aborts the sequence.
	ctx    context.Context
	prompt *prompt
	choice int
	// target is the number of tokens the sequence will produce and reason
	// the finish reason it will then report; both are known on arrival
	// because answers are deterministic.
	target int
	reason string
	out    output
	// start is where in the answer the sequence begins: the tokens of
	// the assistant prefix it continues (0 for a new answer).
	start   int
	arrival time.Time
	// priority is the request's vLLM priority: the waiting queue is
	// ordered by it, lower first, and by arrival within it (vLLM's
	// priority scheduling); 0 for a request that sent none, so that
	// requests without one queue FIFO.
	priority int
	// events has room for every token plus the final event of every
	// sequence of the request, which share it, so the scheduler never
	// blocks on a slow client.
	events chan event
	// unwatch stops the cancellation watch that wakes the replica.
	unwatch func() bool

	generated int
	// blocks are the KV blocks the sequence holds beyond its prompt's
	// shared ones; it holds none while it waits.
	blocks    int
	finished  bool // static mode: done, waiting for its batch to end
	lastToken time.Time
}

func (s *sequence) contextLen() int { return s.prompt.tokens + s.generated }

// send never blocks: events is sized for the whole life of the request.
func (s *sequence) send(ev event) {
	ev.choice = s.choice
	select {
	case s.events <- ev:
	default:
	}
}

// replica is one simulated engine: a paged KV cache, a waiting queue and a
// running batch, advanced by one scheduler goroutine.
type replica struct {
	id      int
	cfg     Config
	limit   func() int // current max_num_seqs, changeable at run time
	fault   func() Fault
	clock   clock
	metrics *metrics
	log     *slog.Logger
	wake    chan struct{}

	mu          sync.Mutex
	waiting     []*sequence // by priority, FIFO within one; preempted sequences go back to the front of theirs
	running     []*sequence // in admission order, so the newest is last
	free        int         // free KV blocks
	preemptions int64
	completed   int64
	draining    bool
	stopped     bool
}

func newReplica(id int, cfg Config, limit func() int, fault func() Fault, clk clock, m *metrics, log *slog.Logger) *replica {
	return &replica{
		id:      id,
		cfg:     cfg,
		limit:   limit,
		fault:   fault,
		clock:   clk,
		metrics: m,
		log:     log.With("replica", id),
		wake:    make(chan struct{}, 1),
		free:    cfg.KVCacheBlocks,
	}
}

// poke wakes an idle scheduler; a pending wake is enough, so it never blocks.
func (r *replica) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *replica) blocksFor(tokens int) int {
	return (tokens + r.cfg.BlockSize - 1) / r.cfg.BlockSize
}

// ownBlocks is what the sequence needs of its own for its context and the
// token it produces next: the blocks beyond its prompt's shared ones.
func (r *replica) ownBlocks(s *sequence) int {
	return r.blocksFor(s.contextLen()+1) - s.prompt.shared
}

// submit queues the sequences of one request, together so that they share
// its prompt. It fails once the replica drains or stops.
func (r *replica) submit(seqs []*sequence) error {
	// A cancelled request must free its blocks even while the replica sleeps
	// or idles, so cancellation wakes the scheduler.
	for _, s := range seqs {
		s.unwatch = context.AfterFunc(s.ctx, r.poke)
	}
	r.mu.Lock()
	if r.draining || r.stopped {
		r.mu.Unlock()
		for _, s := range seqs {
			s.unwatch()
		}
		return errReplicaGone
	}
	for _, s := range seqs {
		// Behind every waiter of its priority or a more urgent one.
		at := len(r.waiting)
		for at > 0 && r.waiting[at-1].priority > s.priority {
			at--
		}
		r.waiting = slices.Insert(r.waiting, at, s)
	}
	r.mu.Unlock()
	r.poke()
	return nil
}

func (r *replica) load() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.running) + len(r.waiting)
}

// drain stops new work from arriving; the scheduler exits once it has
// finished what it holds.
func (r *replica) drain() {
	r.mu.Lock()
	r.draining = true
	r.mu.Unlock()
	r.poke()
}

// run is the scheduler loop: plan a step, sleep for its duration, apply it.
func (r *replica) run(ctx context.Context) {
	var next time.Time
	for {
		dur, busy, exit := r.schedule()
		if exit {
			r.log.Info("replica drained")
			return
		}
		if !busy {
			next = time.Time{}
			select {
			case <-ctx.Done():
				r.abortAll(errServerClosed)
				return
			case <-r.wake:
			}
			continue
		}
		now := r.clock.Now()
		if next.IsZero() || now.Sub(next) > maxCatchUp {
			next = now
		}
		next = next.Add(dur)
		if err := r.clock.SleepUntil(ctx, next); err != nil {
			r.abortAll(errServerClosed)
			return
		}
		r.step()
	}
}

// schedule prepares the next step: it drops cancelled sequences, makes room
// in the KV cache for every running sequence's next token (preempting if it
// must), admits waiting sequences, and returns how long the step takes.
func (r *replica) schedule() (dur time.Duration, busy, exit bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	r.dropCancelled(now)
	preempted := r.reserveSlots()
	prefill := 0
	// Like vLLM, a step that had to preempt admits nobody: the cache is
	// already too tight for the sequences it has.
	if !preempted || len(r.running) == 0 {
		prefill = r.admit()
	}
	if len(r.running) == 0 {
		if r.draining && len(r.waiting) == 0 {
			r.stopped = true
			return 0, false, true
		}
		return 0, false, false
	}
	dur = r.cfg.DecodeBase +
		time.Duration(len(r.running))*r.cfg.DecodePerSeq +
		time.Duration(prefill)*r.cfg.PrefillPerToken +
		r.fault().TokenDelay
	return dur, true, false
}

func (r *replica) dropCancelled(now time.Time) {
	keep := func(list []*sequence) []*sequence {
		kept := list[:0]
		for _, s := range list {
			if s.ctx.Err() != nil {
				r.abort(s, now, s.ctx.Err())
				continue
			}
			kept = append(kept, s)
		}
		clear(list[len(kept):])
		return kept
	}
	r.waiting = keep(r.waiting)
	r.running = keep(r.running)
}

// reserveSlots gives every unfinished running sequence, oldest first, a KV
// slot for the token it produces next. When no block is free the newest
// running sequence is preempted, which may be the one asking.
func (r *replica) reserveSlots() (preempted bool) {
	for i := 0; i < len(r.running); i++ {
		s := r.running[i]
		if s.finished {
			continue
		}
		for s.blocks < r.ownBlocks(s) {
			if r.free > 0 {
				r.free--
				s.blocks++
				continue
			}
			j := r.newestUnfinished()
			r.preempt(j)
			preempted = true
			if j == i {
				i--
				break
			}
		}
	}
	return preempted
}

func (r *replica) newestUnfinished() int {
	for j := len(r.running) - 1; j >= 0; j-- {
		if !r.running[j].finished {
			return j
		}
	}
	return -1
}

// preempt is vLLM's recompute preemption: the sequence loses its KV blocks
// and goes back to the front of the queue. The tokens it already sent stay
// sent; readmission prefills its generated tokens again, and its prompt
// too unless another choice of the request still holds it.
func (r *replica) preempt(j int) {
	s := r.running[j]
	r.log.Debug("preempted sequence", "blocks", s.blocks, "generated", s.generated)
	r.freeBlocks(s)
	r.running = slices.Delete(r.running, j, j+1)
	at := 0
	for at < len(r.waiting) && r.waiting[at].priority < s.priority {
		at++
	}
	r.waiting = slices.Insert(r.waiting, at, s)
	r.preemptions++
	r.metrics.preemption()
}

// admit moves waiting sequences into the batch, in queue order, while the batch has
// room and the cache has blocks for the sequence's context plus the token
// its prefill produces. A sequence whose prompt another choice of its
// request holds needs only its own blocks, and prefills only the tokens it
// generated before a preemption. The queue head blocks the rest, as in
// vLLM, so a large prompt is not starved by small ones.
func (r *replica) admit() (prefillTokens int) {
	if r.cfg.Mode == ModeStatic && len(r.running) > 0 {
		return 0
	}
	limit := r.limit()
	for len(r.waiting) > 0 && len(r.running) < limit {
		s := r.waiting[0]
		own := r.ownBlocks(s)
		need, prefill := own, s.generated
		if s.prompt.holders == 0 {
			need += s.prompt.shared
			prefill += s.prompt.tokens
		}
		if need > r.free {
			break
		}
		r.waiting[0] = nil
		r.waiting = r.waiting[1:]
		s.blocks = own
		s.prompt.holders++
		r.free -= need
		r.running = append(r.running, s)
		prefillTokens += prefill
		if !s.prompt.counted {
			s.prompt.counted = true
			r.metrics.promptTokens(s.prompt.tokens)
		}
	}
	return prefillTokens
}

// freeBlocks gives back the sequence's KV blocks, and its prompt's shared
// blocks when no other choice of the request holds them.
func (r *replica) freeBlocks(s *sequence) {
	if s.blocks == 0 {
		return
	}
	r.free += s.blocks
	s.blocks = 0
	s.prompt.holders--
	if s.prompt.holders == 0 {
		r.free += s.prompt.shared
	}
}

// step applies a decode step: every unfinished running sequence emits one
// token, unless a fault stalls it. In continuous mode a sequence leaves the
// batch as soon as it is done; in static mode the batch is released only
// when all of it is done.
func (r *replica) step() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	fault := r.fault()
	kept := r.running[:0]
	for _, s := range r.running {
		if s.finished {
			kept = append(kept, s)
			continue
		}
		if s.ctx.Err() != nil {
			r.abort(s, now, s.ctx.Err())
			continue
		}
		if fault.dies(s.start, s.generated) {
			r.abort(s, now, errDied)
			continue
		}
		if fault.stalls(s.generated) {
			// A hung sequence keeps its slot and blocks, as it would in
			// a hung engine, until its client gives up.
			kept = append(kept, s)
			continue
		}
		r.emit(s, now)
		if s.generated == s.target {
			s.finished = true
			if r.cfg.Mode == ModeContinuous {
				r.release(s, now)
				continue
			}
		}
		kept = append(kept, s)
	}
	clear(r.running[len(kept):])
	r.running = kept
	if r.cfg.Mode == ModeStatic && len(r.running) > 0 && r.newestUnfinished() < 0 {
		for _, s := range r.running {
			r.release(s, now)
		}
		clear(r.running)
		r.running = r.running[:0]
	}
}

func (r *replica) emit(s *sequence, now time.Time) {
	s.send(event{text: s.out.token(s.generated)})
	if s.generated == 0 {
		r.metrics.firstToken(now.Sub(s.arrival))
	} else {
		r.metrics.nextToken(now.Sub(s.lastToken))
	}
	s.lastToken = now
	s.generated++
}

func (r *replica) release(s *sequence, now time.Time) {
	r.freeBlocks(s)
	r.completed++
	s.unwatch()
	r.metrics.finished(s.reason, now.Sub(s.arrival))
	s.send(event{done: true, reason: s.reason})
}

func (r *replica) abort(s *sequence, now time.Time, err error) {
	r.freeBlocks(s)
	s.unwatch()
	r.metrics.finished(finishAbort, now.Sub(s.arrival))
	s.send(event{err: err})
}

// abortAll ends every sequence the replica holds; used when the server closes.
func (r *replica) abortAll(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	for _, s := range r.running {
		r.abort(s, now, err)
	}
	for _, s := range r.waiting {
		r.abort(s, now, err)
	}
	r.running, r.waiting = nil, nil
	r.stopped = true
}

// ReplicaStats is a snapshot of one replica.
type ReplicaStats struct {
	ID int
	// Draining replicas take no new requests and stop once empty.
	Draining bool
	// Running and Waiting count sequences, as max_num_seqs does: a
	// request with n choices is n of them.
	Running     int
	Waiting     int
	UsedBlocks  int
	TotalBlocks int
	Preemptions int64
	// Completed counts sequences that finished normally (stop or length):
	// one per request, n for a request with n choices.
	Completed int64
}

func (r *replica) stats() ReplicaStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return ReplicaStats{
		ID:          r.id,
		Draining:    r.draining,
		Running:     len(r.running),
		Waiting:     len(r.waiting),
		UsedBlocks:  r.cfg.KVCacheBlocks - r.free,
		TotalBlocks: r.cfg.KVCacheBlocks,
		Preemptions: r.preemptions,
		Completed:   r.completed,
	}
}
