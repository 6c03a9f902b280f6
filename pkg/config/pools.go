package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/request"
)

// Pools holds the two LLM pools requests are routed to by prompt length.
type Pools struct {
	Short Pool `yaml:"short"`
	Long  Pool `yaml:"long"`
	// Shared is the budget of pools that serve the same model from the
	// same servers (SharesBackends): admission then keeps one fair queue
	// in tokens across both, so a tenant's share of the servers holds
	// whichever pool its prompts route to, and each pool's
	// max_concurrency caps what it may borrow of the budget.
	Shared SharedPools `yaml:"shared"`
}

// SharedPools is the admission budget of pools on the same servers.
type SharedPools struct {
	// MaxConcurrency is how many streams the servers run at once (vLLM's
	// --max-num-seqs summed over them, OLLAMA_NUM_PARALLEL): the pools
	// together never hold more. 0 takes the larger pool's
	// max_concurrency. Ignored when the pools are on different servers.
	MaxConcurrency int `yaml:"max_concurrency"`
}

// SharesBackends reports whether the two pools serve the same model from
// the same servers (the same endpoint set, whatever the order or a
// trailing "/v1"), so that they draw on one capacity.
func (p Pools) SharesBackends() bool {
	return p.Short.Model == p.Long.Model && slices.Equal(endpointSet(p.Short.Endpoints), endpointSet(p.Long.Endpoints))
}

// SharedLimit is the budget of pools that share backends
// (shared.max_concurrency, or the larger pool's), 0 when they do not.
func (p Pools) SharedLimit() int {
	if !p.SharesBackends() {
		return 0
	}
	if p.Shared.MaxConcurrency > 0 {
		return p.Shared.MaxConcurrency
	}
	return max(p.Short.MaxConcurrency, p.Long.MaxConcurrency)
}

// endpointSet is endpoints normalised and sorted, for comparing pools.
func endpointSet(endpoints []string) []string {
	out := make([]string, 0, len(endpoints))
	for _, e := range endpoints {
		e = strings.TrimRight(strings.TrimSpace(e), "/")
		out = append(out, strings.TrimSuffix(e, "/v1"))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Pool is one OpenAI-compatible LLM endpoint list with its own permits.
type Pool struct {
	// Endpoints are base URLs of OpenAI-compatible servers (".../v1" is added
	// when missing); requests are spread round-robin.
	Endpoints []string `yaml:"endpoints"`
	// Model is sent as "model" in the chat completion request, and is
	// what OpenAI clients name to be routed here (GET /v1/models).
	Model string `yaml:"model"`
	// Unsupported lists what this pool's backend cannot take, so that a
	// request asking for it is refused with 400 at the door rather than
	// sent to fail or be ignored there: OpenAI parameters (logit_bias on
	// Ollama, say; n for more than one answer) and content part types
	// (image_url on a text-only model).
	Unsupported []string `yaml:"unsupported"`
	// APIKey, if set, is sent as a bearer token.
	APIKey string `yaml:"api_key"`
	// MaxConcurrency is the number of permits: streams in flight at once.
	MaxConcurrency int `yaml:"max_concurrency"`
	// MaxPromptTokens is the hard limit of a prompt sent to this pool.
	MaxPromptTokens int `yaml:"max_prompt_tokens"`
	// MaxWait bounds a request's wait in this pool's queue (0: the
	// admission.max_wait). A tier's max_wait still wins: it is what the
	// customer was promised. Long answers hold permits longer, so the long
	// pool's queue moves slower and may warrant a longer wait.
	MaxWait time.Duration `yaml:"max_wait"`
	// ConnectTimeout bounds opening a connection to an endpoint (TCP, and
	// TLS for https).
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// FirstTokenTimeout bounds the wait from sending a request to its
	// first token (connecting, the backend's queue and prefill). Passing
	// it is a retryable failure: the retry goes to the next endpoint.
	FirstTokenTimeout time.Duration `yaml:"first_token_timeout"`
	// TokenIdleTimeout bounds the backend's silence between two tokens;
	// passing it interrupts the answer, which no model can resume.
	TokenIdleTimeout time.Duration `yaml:"token_idle_timeout"`
	// Breaker is the circuit breaker each endpoint has.
	Breaker Breaker `yaml:"breaker"`
	// Healing bounds what the healer may do to this pool's permits and
	// batch; Scaler is how it asks for more replicas.
	Healing PoolHealing `yaml:"healing"`
	Scaler  Scaler      `yaml:"scaler"`
	// Continuation is how the pool's backend continues an answer another
	// endpoint began, so that a stream that breaks mid-answer fails over
	// to another endpoint without a repeated or lost token: "vllm"
	// (continue_final_message with add_generation_prompt false; the
	// simulator takes it too), or "none" (the default: a backend that
	// does not know the option would answer anew after the prefix, so
	// such a stream ends stream_interrupted).
	Continuation string `yaml:"continuation"`
	// Priority says whether the pool's backend takes a request priority,
	// which Sluice then sends from each request's service class: "vllm"
	// (vLLM's priority field: the server must run with
	// --scheduling-policy priority, or it refuses the requests), or
	// "none" (the default). Sluice's own order never depends on it.
	Priority string `yaml:"priority"`
	// MaxFailovers bounds how often one answer may move to another
	// endpoint mid-stream.
	MaxFailovers int `yaml:"max_failovers"`
	// Fallbacks are tried in order when this pool cannot answer a request
	// before its first token: every endpoint's circuit is open, the
	// backend answers that the prompt exceeds its context, or the first
	// token misses its deadline on every attempt. Only this pool's list is
	// followed, never a fallback pool's own.
	Fallbacks []Fallback `yaml:"fallbacks"`
}

// Fallback is one place a pool's request may go instead: another model
// on the pool's own endpoints (Model), or another pool, with its
// endpoints, model and permits (Pool). Exactly one is set.
type Fallback struct {
	Model string `yaml:"model"`
	Pool  string `yaml:"pool"`
}

// Pool continuations (Pool.Continuation).
const (
	ContinuationNone = "none"
	ContinuationVLLM = "vllm"
)

// Continues reports whether the pool's backend continues an answer it
// was given the start of (continuation), which a mid-answer failover and
// a paused stream need.
func (p Pool) Continues() bool { return p.Continuation == ContinuationVLLM }

// PausesFor reports whether a waiter queued in pool may have a stream
// paused for it (preemption by continuation): only streams of a pool
// that continues answers pause, and a waiter takes the permit of a
// stream of its own pool or, when the pools share their servers and
// their budget, of either.
func (p Pools) PausesFor(pool string) bool {
	for name, q := range p.ByName() {
		if q.Continues() && (name == pool || p.SharedLimit() > 0) {
			return true
		}
	}
	return false
}

// Pool priorities (Pool.Priority).
const (
	PriorityNone = "none"
	PriorityVLLM = "vllm"
)

// Breaker opens an endpoint's circuit, so that requests go to the pool's
// other endpoints, after failures in a row; a pool whose every circuit is
// open fails requests at once with backend_unavailable.
type Breaker struct {
	// Failures is how many failed streams in a row open the circuit:
	// connect errors, 5xx, deadlines, broken streams, and first tokens
	// slower than SlowFirstToken (not 4xx, not cancels).
	Failures int `yaml:"failures"`
	// OpenFor is how long an open circuit refuses requests; then one
	// request probes the endpoint and its first token closes the circuit.
	OpenFor time.Duration `yaml:"open_for"`
	// SlowFirstToken: a first token slower than this counts as a failure
	// (outlier ejection), but only while another endpoint of the pool is
	// closed: a pool slow all over is loaded, not broken.
	SlowFirstToken time.Duration `yaml:"slow_first_token"`
}

// Routing chooses a pool by the prompt's token count.
type Routing struct {
	// ShortThresholdTokens: prompts with at most this many tokens go short.
	ShortThresholdTokens int `yaml:"short_threshold_tokens"`
	// Encoding is the tiktoken encoding used to count tokens.
	Encoding string `yaml:"encoding"`
}

// LLM configures the streaming LLM call.
type LLM struct {
	SystemPrompt string `yaml:"system_prompt"`
	// Timeout bounds one whole streamed completion.
	Timeout time.Duration `yaml:"timeout"`
	// HeartbeatTimeout: a stream that stops heartbeating this long is
	// presumed lost and retried (only if no token was sent yet).
	HeartbeatTimeout time.Duration `yaml:"heartbeat_timeout"`
	// MaxAttempts bounds retries of an LLM call that failed before its
	// first token.
	MaxAttempts int `yaml:"max_attempts"`
	// TruncationNotice ends an answer cut at its max_tokens on the native
	// API, so that the reader is told instead of left with a sentence that
	// stops mid-word (empty: no notice). The OpenAI routes never send it:
	// their finish_reason says so, and clients parse the content.
	TruncationNotice string `yaml:"truncation_notice"`
}

// defaultPools share the dev stack's one simulator, which runs 16
// sequences: the pools together hold at most 16 permits (the larger
// pool's, as shared.max_concurrency is unset, so that a config naming
// bigger pools needs no budget of its own); the long pool
// may borrow up to 12 of them, which leaves the short pool 4 that long
// prompts cannot take (its first tokens stay quick however many long
// ones wait), and the short pool may use all 16 when no long one waits.
// The short pool's clients are promised a first token within a second
// (interactive), the long pool's within a minute.
func defaultPools() Pools {
	short, long := defaultPool(16, 512), defaultPool(12, 8192)
	short.Healing.TTFTSLO, long.Healing.TTFTSLO = time.Second, time.Minute
	return Pools{Short: short, Long: long}
}

// defaultPool is a pool of the dev stack's one simulator, which serves
// both pools; they differ only in permits and prompt size. Its deadlines
// and breaker are the LLM client's defaults, which suit a real model.
func defaultPool(maxConcurrency, maxPromptTokens int) Pool {
	d, b := llm.DefaultDeadlines(), llm.DefaultBreaker()
	return Pool{
		Endpoints:         []string{"http://127.0.0.1:8090"},
		Model:             "sluice-sim",
		MaxConcurrency:    maxConcurrency,
		MaxPromptTokens:   maxPromptTokens,
		ConnectTimeout:    d.Connect,
		FirstTokenTimeout: d.FirstToken,
		TokenIdleTimeout:  d.TokenIdle,
		Breaker:           Breaker{Failures: b.Failures, OpenFor: b.OpenFor, SlowFirstToken: b.SlowFirstToken},
		Healing:           defaultPoolHealing(),
		Scaler:            defaultScaler(),
		Continuation:      ContinuationNone,
		Priority:          PriorityNone,
		MaxFailovers:      2,
	}
}

func defaultRouting() Routing {
	return Routing{ShortThresholdTokens: 512, Encoding: "cl100k_base"}
}

func defaultLLM() LLM {
	return LLM{
		SystemPrompt:     "You are a helpful assistant. Answer the question using only the context below. If the context does not contain the answer, say so.",
		Timeout:          5 * time.Minute,
		HeartbeatTimeout: 10 * time.Second,
		MaxAttempts:      3,
		TruncationNotice: " … [answer truncated at the length limit]",
	}
}

// validate checks the pools' settings except their permit counts
// (max_concurrency), which are the live policy's: policy.Deployment's
// Validate checks them, against the shared budget among the rest.
func (p Pools) validate(v *validator) {
	p.Short.validate(v, "pools.short")
	p.Long.validate(v, "pools.long")
	p.validateFallbacks(v)
	if p.Shared.MaxConcurrency < 0 {
		v.add("pools.shared.max_concurrency", "must not be negative, got %d", p.Shared.MaxConcurrency)
	}
	short, long := endpointSet(p.Short.Endpoints), endpointSet(p.Long.Endpoints)
	overlap := slices.ContainsFunc(long, func(e string) bool { return slices.Contains(short, e) })
	if !p.SharesBackends() && overlap && p.Short.Model == p.Long.Model {
		// Part of the servers shared: neither one budget nor two holds.
		v.add("pools.long.endpoints", "share some but not all servers with pools.short.endpoints; list the same servers (one shared budget) or none")
	}
}

// validateFallbacks checks each pool's fallbacks: one kind each, a pool
// that exists and is not the pool itself, a model other than the pool's,
// no entry twice, and no two pools that fall back on each other (each
// would be the other's spare, and a request of either could hold up both).
func (p Pools) validateFallbacks(v *validator) {
	pools := p.ByName()
	for _, name := range request.Pools() {
		pool := pools[name]
		seen := map[Fallback]bool{}
		for i, f := range pool.Fallbacks {
			field := fmt.Sprintf("pools.%s.fallbacks[%d]", name, i)
			switch {
			case (f.Model == "") == (f.Pool == ""):
				v.add(field, "must set exactly one of model (another model on this pool's endpoints) or pool (another pool)")
			case f.Pool == name:
				v.add(field+".pool", "must name another pool than %s itself", name)
			case f.Pool != "" && !request.IsPool(f.Pool):
				v.add(field+".pool", "must be %s or %s, got %q", request.PoolShort, request.PoolLong, f.Pool)
			case f.Model != "" && f.Model == pool.Model:
				v.add(field+".model", "must differ from pools.%s.model (%q): a fallback to the same model is a retry", name, pool.Model)
			case seen[f]:
				v.add(field, "is listed twice")
			case f.Pool != "" && fallsBackTo(pools[f.Pool], name):
				v.add(field+".pool", "makes a cycle: pools.%s falls back to %s already", f.Pool, name)
			}
			seen[f] = true
		}
	}
}

// fallsBackTo reports whether pool lists the pool named other among its
// fallbacks.
func fallsBackTo(pool Pool, other string) bool {
	return slices.ContainsFunc(pool.Fallbacks, func(f Fallback) bool { return f.Pool == other })
}

// validate checks the pool at YAML path field.
func (p Pool) validate(v *validator, field string) {
	if len(p.Endpoints) == 0 {
		v.add(field+".endpoints", "must list at least one URL")
	}
	for i, e := range p.Endpoints {
		v.httpURL(fmt.Sprintf("%s.endpoints[%d]", field, i), e)
	}
	v.nonEmpty(field+".model", p.Model)
	for i, u := range p.Unsupported {
		if err := openai.ValidateUnsupported(u); err != nil {
			v.add(fmt.Sprintf("%s.unsupported[%d]", field, i), "%v", err)
		}
	}
	v.positive(field+".max_prompt_tokens", int64(p.MaxPromptTokens))
	if p.MaxWait < 0 {
		v.add(field+".max_wait", "must not be negative, got %s", p.MaxWait)
	}
	p.validateDeadlines(v, field)
	if p.Priority != PriorityNone && p.Priority != PriorityVLLM {
		v.add(field+".priority", "must be %s or %s, got %q", PriorityNone, PriorityVLLM, p.Priority)
	}
	if p.Continuation != ContinuationNone && p.Continuation != ContinuationVLLM {
		v.add(field+".continuation", "must be %s or %s, got %q", ContinuationNone, ContinuationVLLM, p.Continuation)
	}
	v.positive(field+".max_failovers", int64(p.MaxFailovers))
	p.Healing.validate(v, field, p.MaxConcurrency)
	p.Scaler.validate(v, field+".scaler")
}

// validateDeadlines checks the pool's deadlines and breaker. Waiting for
// a connection or calling a first token slow only makes sense within the
// first-token deadline, which bounds both.
func (p Pool) validateDeadlines(v *validator, field string) {
	v.duration(field+".connect_timeout", p.ConnectTimeout)
	v.duration(field+".first_token_timeout", p.FirstTokenTimeout)
	v.duration(field+".token_idle_timeout", p.TokenIdleTimeout)
	v.positive(field+".breaker.failures", int64(p.Breaker.Failures))
	v.duration(field+".breaker.open_for", p.Breaker.OpenFor)
	v.duration(field+".breaker.slow_first_token", p.Breaker.SlowFirstToken)
	below := func(name string, d time.Duration) {
		if p.FirstTokenTimeout > 0 && d >= p.FirstTokenTimeout {
			v.add(field+"."+name, "must be below %s.first_token_timeout (%s), got %s", field, p.FirstTokenTimeout, d)
		}
	}
	below("connect_timeout", p.ConnectTimeout)
	below("breaker.slow_first_token", p.Breaker.SlowFirstToken)
}

// validate checks the routing rule against the short pool, which must
// take every prompt the rule sends it.
func (r Routing) validate(v *validator, short Pool) {
	v.positive("routing.short_threshold_tokens", int64(r.ShortThresholdTokens))
	switch r.Encoding {
	case "cl100k_base", "o200k_base":
	default:
		v.add("routing.encoding", "must be cl100k_base or o200k_base, got %q", r.Encoding)
	}
	if short.MaxPromptTokens > 0 && r.ShortThresholdTokens > short.MaxPromptTokens {
		v.add("routing.short_threshold_tokens", "must not exceed pools.short.max_prompt_tokens (%d)", short.MaxPromptTokens)
	}
}

func (l LLM) validate(v *validator) {
	v.duration("llm.timeout", l.Timeout)
	v.duration("llm.heartbeat_timeout", l.HeartbeatTimeout)
	v.positive("llm.max_attempts", int64(l.MaxAttempts))
}

// ByName returns the pools under their route names (pkg/request's
// PoolShort and PoolLong); iterate in request.Pools() order where order
// matters.
func (p Pools) ByName() map[string]Pool {
	return map[string]Pool{request.PoolShort: p.Short, request.PoolLong: p.Long}
}
