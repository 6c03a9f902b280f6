package activities

import "time"

// HealthInput asks for the health signals of each pool over the last
// Window of the shared latency window.
type HealthInput struct {
	Pools []string
	// Stage is the stage whose tail is watched (e.g. "llm_first_token").
	Stage  string
	Window time.Duration
	// Levels is each pool's level before this poll's decisions and
	// Interval the time between polls, for the sluice_healing_level
	// gauge.
	Levels   map[string]int `json:",omitempty"`
	Interval time.Duration  `json:",omitempty"`
}

// PoolHealth is what the healer sees of one pool.
type PoolHealth struct {
	Pool string
	// Samples is how many latencies of Stage the window holds; P50Ms,
	// P99Ms and Ratio (P99/P50) are meaningless when it is small.
	Samples      int64
	P50Ms, P99Ms float64
	Ratio        float64
	// QueueDepth, InUse and Permits are the admission gate's.
	QueueDepth, InUse, Permits int
	// Requests and Timeouts are the window's counters; TimeoutRate their
	// ratio (0 without requests).
	Requests, Timeouts int64
	TimeoutRate        float64
	// KVCacheUsage (0..1) and BackendWaiting come from the pool's
	// backends' /metrics in vLLM's names (the highest of its endpoints);
	// -1 when no endpoint answered.
	KVCacheUsage   float64
	BackendWaiting int
	// Endpoints is how many backends the pool has; Ejected how many of
	// them have their circuit open, as the worker that read the health
	// sees them (each worker keeps its own breakers).
	Endpoints, Ejected int
	// TTFTSamples and TTFTP99Ms are the window's first tokens as clients
	// wait for them (the ttft stage: from the request, admission
	// included), whatever Stage the healer watches.
	TTFTSamples int64   `json:",omitempty"`
	TTFTP99Ms   float64 `json:",omitempty"`
}

// HealthOutput holds every pool's health, in the order asked.
type HealthOutput struct {
	Pools []PoolHealth
}

// SetPermitsInput sets a pool's permit count (absolute: a retry is a
// no-op).
type SetPermitsInput struct {
	Pool    string
	Permits int
	Reason  string
}

// SetBatchInput sets the running-batch cap (vLLM's max_num_seqs) of every
// endpoint of a pool that can change it at run time.
type SetBatchInput struct {
	Pool       string
	MaxNumSeqs int
	Reason     string
}

// SetBatchOutput says how many endpoints took the change; a backend
// without a run-time admin API (vLLM, TGI) takes none, and the permit
// count is then the only batch control.
type SetBatchOutput struct {
	Applied, Endpoints int
}

// ThrottleLongInput sets the factor by which requests routed to the long
// pool are charged against token rate limits (1: as any request).
type ThrottleLongInput struct {
	CostFactor float64
	Reason     string
}

// ScaleInput asks a pool's scaler for an absolute replica count.
type ScaleInput struct {
	Pool     string
	Replicas int
	Reason   string
}

// ShedInput rejects the waiting requests of a pool's lowest tier (lowest
// weight), each with a clean rejected event.
type ShedInput struct {
	Pool   string
	Reason string
	// Max bounds how many are shed, the newest first (0: all of the tier).
	Max int
}

// ShedOutput counts the requests shed, and the weight (tier) they had (0
// when none: fewer than two tiers were waiting).
type ShedOutput struct {
	Shed   int
	Weight int
}

// AlertInput reports a pool entering a worse state: logged, counted and
// posted to the configured webhook.
type AlertInput struct {
	Pool    string
	Level   string
	Message string
	Health  PoolHealth
}
