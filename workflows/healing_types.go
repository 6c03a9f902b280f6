package workflows

import "time"

// Names of the healing workflow and its handlers.
const (
	HealingWorkflowName = "HealingWorkflow"
	// HealingWorkflowID is the one healing workflow of a deployment
	// (task queue): the worker starts it idempotently under this ID.
	HealingWorkflowIDPrefix = "sluice-healing-"

	// SignalPause stops the healer acting (it keeps observing);
	// SignalResume lets it act again. No payload.
	SignalPause  = "pause"
	SignalResume = "resume"
	// SignalOverride pins a pool at a level, or releases it (payload
	// OverrideSignal).
	SignalOverride = "override"
	// SignalSettings hands a running healer new settings (payload
	// HealingSettings): workers send theirs when they start, so a config
	// change reaches the healer without restarting it.
	SignalSettings = "settings"
	// SignalStop ends the healer for good (no payload): it steps every
	// pool back to normal, undoing what it applied, one level a poll,
	// and completes once all are normal. Workers send it when they start
	// with healing.enabled off.
	SignalStop = "stop"
	// QueryHealing returns HealingStatus.
	QueryHealing = "healing"
)

// HealingWorkflowID is the healing workflow's ID for a task queue.
func HealingWorkflowID(taskQueue string) string { return HealingWorkflowIDPrefix + taskQueue }

// Healing levels of a pool, in escalation order. Each level adds its
// action to those below it; stepping back undoes the level left.
const (
	LevelNormal   = 0
	LevelShrink   = 1 // fewer permits and a smaller backend batch
	LevelThrottle = 2 // the long pool's permits cut, long requests charged more against token limits
	LevelScale    = 3 // more replicas
	LevelShed     = 4 // the lowest tier's waiting requests rejected
	maxLevel      = LevelShed
)

// HealingInput starts (or continues) the healing workflow.
type HealingInput struct {
	Settings HealingSettings
	// State is carried over ContinueAsNew; nil on the first start.
	State *HealingState
}

// HealingSettings are the healer's thresholds and bounds, copied from
// config at start.
type HealingSettings struct {
	// Interval between polls; Window is how far back each poll looks.
	Interval time.Duration
	Window   time.Duration
	// Stage is the stage whose P99/P50 is watched.
	Stage string
	// P99/P50 above 2 warns, above 5 is critical: a healthy stage's tail
	// is within twice its median.
	WarnRatio, CriticalRatio float64
	// WarnKVCache: backend KV-cache use (0..1) that warns.
	WarnKVCache float64
	// CriticalQueueDepth and CriticalTimeoutRate are critical too.
	CriticalQueueDepth  int
	CriticalTimeoutRate float64
	// CriticalP99 is critical whatever the ratio (0: off). In a collapse
	// P50 grows with P99 and the ratio understates the tail.
	CriticalP99 time.Duration
	// MinSamples: with fewer latencies in the window the ratio is not
	// trusted (a handful of requests has no tail).
	MinSamples int64
	// HealthyPolls in a row step a pool back one level; Cooldown is the
	// least time between two level changes of a pool.
	HealthyPolls int
	Cooldown     time.Duration
	// LongCostFactor is how hard throttling bears on long requests (e.g.
	// 2): their token charge multiplied, the long pool's permits divided.
	LongCostFactor float64
	Pools          []PoolBounds
	// PollsPerRun bounds a run's history: then ContinueAsNew.
	PollsPerRun int
}

// PoolBounds are a pool's baseline and the bounds no action crosses.
type PoolBounds struct {
	Pool string
	// BasePermits is the configured permit count; shrinking halves it,
	// never below MinPermits.
	BasePermits, MinPermits int
	// BaseBatch is the backends' max_num_seqs; shrinking halves it, never
	// below MinBatch (0: the batch is not tuned).
	BaseBatch, MinBatch int
	// BaseReplicas and MaxReplicas bound scaling (MaxReplicas 0: the pool
	// has no scaler).
	BaseReplicas, MaxReplicas int
	// TTFTSLO is the pool's clients' first-token promise: a tail ratio
	// does not make it critical while their P99 is within it (0: it does).
	TTFTSLO time.Duration `json:",omitempty"`
}

// HealingState is what the healer remembers across polls and runs.
type HealingState struct {
	Pools     []PoolState
	Paused    bool
	Decisions []Decision
	Polls     int64
	// Stopping: told to stop (SignalStop), the healer only steps pools
	// back, and ends once all are normal.
	Stopping bool `json:",omitempty"`
}

// PoolState is one pool's level and what is applied to it.
type PoolState struct {
	Pool  string
	Level int
	// Alert is the last alert level reported ("", "warn", "critical").
	Alert         string
	HealthyStreak int
	LastChange    time.Time
	// Permits, Batch and Replicas are what the healer last applied.
	Permits, Batch, Replicas int
	// Overridden: a person pinned the level; the healer holds it.
	Overridden bool
	// Hold is how many healthy polls in a row step the pool back (0:
	// HealthyPolls). It doubles each time the pool has to escalate again
	// after stepping back — the load that needed the level is still
	// there — up to maxHoldFactor × HealthyPolls, and returns to
	// HealthyPolls once the pool has held its baseline that long.
	Hold int `json:",omitempty"`
	// SteppedBack: the pool's last level change was a step back.
	SteppedBack bool `json:",omitempty"`
	// Starved: the pool's last escalation was for its queue, not its
	// backends' tail; the healer does not cut its capacity (spares).
	Starved bool `json:",omitempty"`
}

// Decision is one thing the healer did or tried.
type Decision struct {
	At     time.Time
	Pool   string
	From   int
	To     int
	Action string
	Reason string
	Error  string `json:",omitempty"`
}

// OverrideSignal pins Pool at Level; Level -1 releases the pin.
type OverrideSignal struct {
	Pool  string
	Level int
}

// HealingStatus answers QueryHealing.
type HealingStatus struct {
	Paused    bool
	Pools     []PoolState
	Decisions []Decision
	Polls     int64
}
