package config

import (
	"math"
	"time"
)

// Admission configures the concurrency gate in front of the LLM pools.
type Admission struct {
	// MaxWait bounds how long a request waits in the queue.
	MaxWait time.Duration `yaml:"max_wait"`
	// Lease is how long a permit lives without renewal; a crashed holder's
	// permit comes back after at most this long.
	Lease time.Duration `yaml:"lease"`
	// RecheckInterval is the Retry-After of a request refused because a
	// queue was full, and how long the gate keeps a waiter's queue place
	// alive between its calls. Requests wait for their grant with one
	// timer for their whole max wait. At least 1s (workflow timers under
	// 1 s are not precise).
	RecheckInterval time.Duration `yaml:"recheck_interval"`
	// FastWait is how long a request whose turn is near (no more waiters
	// ahead of it than the pool has permits) waits for its grant inside
	// its admission activity, woken over Redis pub/sub in about a
	// millisecond rather than by a Temporal signal; then it parks as
	// usual. A cancel reaches such a request after at most this long.
	// 0 turns it off; under 4s (a local activity's time limit is 5s).
	FastWait time.Duration `yaml:"fast_wait"`
	// MaxQueueDepth bounds the waiting queue of each pool.
	MaxQueueDepth int `yaml:"max_queue_depth"`
	// OutputTokenWeight is what one output token (of max_tokens) costs in
	// the fair queue and the waiting room against one prompt token: 1
	// shares prompt + output tokens; 2 shares prompt + 2 × output, the
	// cost of a request in the VTC paper (Sheng et al., OSDI 2024), since
	// a decoded token costs a backend more than a prefilled one. The rate
	// limits charge tokens as they are, whatever it is.
	OutputTokenWeight float64 `yaml:"output_token_weight"`
	// Preemption pauses a stream of a less urgent class for a waiter of a
	// more urgent one when its pool has no permit free.
	Preemption Preemption `yaml:"preemption"`
}

// Preemption configures pausing streams by continuation: a paused
// stream stops upstream, gives its permit to the urgent waiter, queues
// again at the head of the line and continues its answer (on any
// endpoint of its pool) when granted again. Only a pool whose backend
// can continue an answer (pools.*.continuation) is ever paused.
type Preemption struct {
	// Enabled turns it on. Off by default until the SLO bench has
	// measured what it buys against what a pause costs.
	Enabled bool `yaml:"enabled"`
	// MinTokens is how many tokens a stream streams after it starts, and
	// after each restart, before it may be paused: each pause costs its
	// backend the prefill of the answer so far.
	MinTokens int `yaml:"min_tokens"`
	// MaxPauses is how many times one stream may be paused.
	MaxPauses int `yaml:"max_pauses"`
}

func defaultAdmission() Admission {
	return Admission{
		MaxWait:         30 * time.Second,
		Lease:           30 * time.Second,
		RecheckInterval: 2 * time.Second,
		FastWait:        time.Second,
		MaxQueueDepth:   10000,
		// Tokens as they are: a token of the prompt and one of the answer
		// cost alike.
		OutputTokenWeight: 1,
		Preemption:        Preemption{MinTokens: 32, MaxPauses: 2},
	}
}

func (a Admission) validate(v *validator) {
	v.duration("admission.max_wait", a.MaxWait)
	v.duration("admission.lease", a.Lease)
	if a.Lease > 0 && a.Lease < 3*time.Second {
		v.add("admission.lease", "must be at least 3s (it is renewed every third of it, and a lost lease lets another request in), got %s", a.Lease)
	}
	v.duration("admission.recheck_interval", a.RecheckInterval)
	if a.FastWait < 0 || a.FastWait >= 4*time.Second {
		v.add("admission.fast_wait", "must be between 0 (off) and 4s, got %s", a.FastWait)
	}
	if a.RecheckInterval > 0 && a.RecheckInterval < time.Second {
		v.add("admission.recheck_interval", "must be at least 1s (workflow timers are not sub-second), got %s", a.RecheckInterval)
	}
	v.positive("admission.max_queue_depth", int64(a.MaxQueueDepth))
	// Bounded so that a typical request stays near cost 1 (the queue's
	// virtual time has a budget; admission.TokenCost).
	if !(a.OutputTokenWeight > 0) || a.OutputTokenWeight > maxOutputTokenWeight || math.IsInf(a.OutputTokenWeight, 0) {
		v.add("admission.output_token_weight", "must be above 0 and at most %v, got %v", maxOutputTokenWeight, a.OutputTokenWeight)
	}
	a.Preemption.validate(v)
}

func (p Preemption) validate(v *validator) {
	if p.MinTokens < 1 {
		v.add("admission.preemption.min_tokens", "must be at least 1 (a stream paused before its first token only pays a prefill), got %d", p.MinTokens)
	}
	if p.MaxPauses < 1 {
		v.add("admission.preemption.max_pauses", "must be at least 1 (set enabled: false to pause none), got %d", p.MaxPauses)
	}
}

// maxOutputTokenWeight bounds admission.output_token_weight.
const maxOutputTokenWeight = 16
