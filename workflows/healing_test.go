package workflows

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/activities"
)

func healingSettings() HealingSettings {
	return HealingSettings{
		Interval: 10 * time.Second, Window: time.Minute, Stage: "llm_first_token",
		WarnRatio: 2, CriticalRatio: 5, WarnKVCache: 0.75, CriticalQueueDepth: 100, CriticalTimeoutRate: 0.05,
		MinSamples: 50, HealthyPolls: 3, Cooldown: 0, LongCostFactor: 2, PollsPerRun: 1000,
		Pools: []PoolBounds{
			{Pool: "short", BasePermits: 16, MinPermits: 2, BaseBatch: 32, MinBatch: 4, BaseReplicas: 2, MaxReplicas: 4},
			{Pool: "long", BasePermits: 4, MinPermits: 1},
		},
	}
}

// Health the tests feed the healer.
var (
	healthy  = activities.PoolHealth{Samples: 500, P50Ms: 100, P99Ms: 150, Ratio: 1.5, KVCacheUsage: 0.3}
	warnTail = activities.PoolHealth{Samples: 500, P50Ms: 100, P99Ms: 300, Ratio: 3, KVCacheUsage: 0.3}
	critical = activities.PoolHealth{Samples: 500, P50Ms: 100, P99Ms: 800, Ratio: 8, KVCacheUsage: 0.9}
)

// healRun runs the healing workflow for len(script) polls: poll n sees
// script[n] for the short pool (the long pool stays healthy), and ends in
// ContinueAsNew, whose input carries the state.
type healRun struct {
	t      *testing.T
	env    *testsuite.TestWorkflowEnvironment
	script []activities.PoolHealth
	// long, if set, is the long pool's health poll by poll (else healthy).
	long []activities.PoolHealth

	mu    sync.Mutex
	polls int
	taken []string
	// fail makes the named action fail while > 0 (counted per call).
	fail map[string]int
}

func newHealRun(t *testing.T, script ...activities.PoolHealth) *healRun {
	var s testsuite.WorkflowTestSuite
	r := &healRun{t: t, env: s.NewTestWorkflowEnvironment(), script: script, fail: map[string]int{}}
	r.env.RegisterWorkflowWithOptions(HealingWorkflow, workflow.RegisterOptions{Name: HealingWorkflowName})
	register := func(name string, fn any) {
		r.env.RegisterActivityWithOptions(fn, activity.RegisterOptions{Name: name})
	}
	register(actReadHealth, func(_ context.Context, in activities.HealthInput) (activities.HealthOutput, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		ph := healthy
		if r.polls < len(r.script) {
			ph = r.script[r.polls]
		}
		long := healthy
		if r.polls < len(r.long) {
			long = r.long[r.polls]
		}
		r.polls++
		ph.Pool = "short"
		long.Pool = "long"
		return activities.HealthOutput{Pools: []activities.PoolHealth{ph, long}}, nil
	})
	register(actSetPermits, func(_ context.Context, in activities.SetPermitsInput) error {
		return r.did(actSetPermits, fmt.Sprintf("%s=%d", in.Pool, in.Permits))
	})
	register(actSetBatch, func(_ context.Context, in activities.SetBatchInput) (activities.SetBatchOutput, error) {
		return activities.SetBatchOutput{Applied: 1, Endpoints: 1}, r.did(actSetBatch, fmt.Sprintf("%s=%d", in.Pool, in.MaxNumSeqs))
	})
	register(actThrottleLong, func(_ context.Context, in activities.ThrottleLongInput) error {
		return r.did(actThrottleLong, fmt.Sprint(in.CostFactor))
	})
	register(actScale, func(_ context.Context, in activities.ScaleInput) error {
		return r.did(actScale, fmt.Sprintf("%s=%d", in.Pool, in.Replicas))
	})
	register(actShed, func(_ context.Context, in activities.ShedInput) (activities.ShedOutput, error) {
		return activities.ShedOutput{Shed: 3}, r.did(actShed, in.Pool)
	})
	register(actAlert, func(_ context.Context, in activities.AlertInput) error {
		return r.did(actAlert, in.Pool+"/"+in.Level)
	})
	return r
}

// did records an action, or fails it as asked.
func (r *healRun) did(name, what string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail[name] > 0 {
		r.fail[name]--
		r.taken = append(r.taken, "FAILED "+name+" "+what)
		return errors.New("backend said no")
	}
	r.taken = append(r.taken, name+" "+what)
	return nil
}

func (r *healRun) run(set HealingSettings) HealingState {
	r.t.Helper()
	set.PollsPerRun = len(r.script)
	r.env.ExecuteWorkflow(HealingWorkflowName, HealingInput{Settings: set})
	require.True(r.t, r.env.IsWorkflowCompleted())
	var can *workflow.ContinueAsNewError
	require.True(r.t, errors.As(r.env.GetWorkflowError(), &can), "want ContinueAsNew, got %v", r.env.GetWorkflowError())
	var next HealingInput
	require.NoError(r.t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	require.NotNil(r.t, next.State)
	require.Equal(r.t, set, next.Settings)
	return *next.State
}

// actions are the actions taken, in order.
func (r *healRun) actions() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.taken...)
}

func repeat(ph activities.PoolHealth, n int) []activities.PoolHealth {
	out := make([]activities.PoolHealth, n)
	for i := range out {
		out[i] = ph
	}
	return out
}

func concat(parts ...[]activities.PoolHealth) []activities.PoolHealth {
	var out []activities.PoolHealth
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func shortLevel(st HealingState) int { return st.Pools[0].Level }

func TestHealingWarnOnlyAlerts(t *testing.T) {
	r := newHealRun(t, repeat(warnTail, 5)...)
	st := r.run(healingSettings())
	require.Equal(t, []string{"Alert short/warn"}, r.actions(), "a warning is reported once and changes nothing")
	require.Equal(t, LevelNormal, shortLevel(st))
}

func TestHealingEscalatesOneLevelPerPollInOrder(t *testing.T) {
	r := newHealRun(t, repeat(critical, 6)...)
	st := r.run(healingSettings())
	require.Equal(t, []string{
		"Alert short/critical",
		"SetPermits short=8", "SetBatch short=16", // 1: shrink
		"ThrottleLong 2", "SetPermits long=2", // 2: throttle long requests
		"Scale short=3",            // 3: scale out
		"Shed short",               // 4: shed the lowest tier
		"Shed short", "Shed short", // still critical: shed again each poll
	}, r.actions())
	require.Equal(t, LevelShed, shortLevel(st))
	require.Equal(t, 8, st.Pools[0].Permits)
	require.Equal(t, 2, st.Pools[1].Permits, "the long pool is capped by the short pool's throttle")
	require.Equal(t, 3, st.Pools[0].Replicas)
	require.Equal(t, LevelNormal, st.Pools[1].Level, "a healthy pool is left alone")
}

func TestHealingCooldownSpacesEscalations(t *testing.T) {
	set := healingSettings()
	set.Cooldown = 25 * time.Second // polls every 10 s: one step every third poll
	r := newHealRun(t, repeat(critical, 7)...)
	st := r.run(set)
	require.Equal(t, LevelScale, shortLevel(st), "polls 1, 4 and 7 may escalate")
	var levels []int
	var at []time.Time
	for _, d := range st.Decisions {
		if d.Action == "level" {
			levels = append(levels, d.To)
			at = append(at, d.At)
		}
	}
	require.Equal(t, []int{1, 2, 3}, levels)
	require.Equal(t, 30*time.Second, at[1].Sub(at[0]))
}

func TestHealingCooldownAlsoSpacesStepsBack(t *testing.T) {
	set := healingSettings()
	set.Cooldown = 25 * time.Second
	set.HealthyPolls = 1
	r := newHealRun(t, concat(repeat(critical, 1), repeat(healthy, 4))...)
	st := r.run(set)
	var at []time.Time
	for _, d := range st.Decisions {
		if d.Action == "level" {
			at = append(at, d.At)
		}
	}
	require.Len(t, at, 2)
	require.Equal(t, 30*time.Second, at[1].Sub(at[0]), "healthy at 10 s, but the step back waits for the cool-down")
	require.Equal(t, LevelNormal, shortLevel(st))
}

func TestHealingRespectsBounds(t *testing.T) {
	set := healingSettings()
	set.Pools[0] = PoolBounds{Pool: "short", BasePermits: 3, MinPermits: 2, BaseBatch: 5, MinBatch: 4, BaseReplicas: 2, MaxReplicas: 2}
	r := newHealRun(t, repeat(critical, 3)...)
	r.run(set)
	require.Equal(t, []string{
		"Alert short/critical",
		"SetPermits short=2", "SetBatch short=4", // halving would cross the minimums
		"ThrottleLong 2", "SetPermits long=2",
		"Scale short=2", // already at the most replicas
	}, r.actions())
}

func TestHealingStepsBackOneLevelAfterHealthyPolls(t *testing.T) {
	r := newHealRun(t, concat(repeat(critical, 2), repeat(healthy, 7))...)
	st := r.run(healingSettings())
	require.Equal(t, []string{
		"Alert short/critical",
		"SetPermits short=8", "SetBatch short=16",
		"ThrottleLong 2", "SetPermits long=2",
		// three healthy polls: back to shrink; three more: back to normal
		"ThrottleLong 1", "SetPermits long=4",
		"SetPermits short=16", "SetBatch short=32",
	}, r.actions())
	require.Equal(t, LevelNormal, shortLevel(st))
	require.Equal(t, 16, st.Pools[0].Permits)
	require.Equal(t, 4, st.Pools[1].Permits)
}

// The long pool's permits are the smaller of its own level's and the
// throttle's cap, and stay at its own when the throttle lifts.
func TestHealingThrottleCapsTheLongPoolWithItsOwnShrink(t *testing.T) {
	set := healingSettings()
	set.Pools[1] = PoolBounds{Pool: "long", BasePermits: 12, MinPermits: 1}
	set.LongCostFactor = 4
	r := newHealRun(t, concat(repeat(critical, 2), repeat(healthy, 4))...)
	r.env.RegisterDelayedCallback(func() { r.env.SignalWorkflow(SignalOverride, OverrideSignal{Pool: "long", Level: LevelShrink}) }, 5*time.Second)
	st := r.run(set)
	require.Equal(t, []string{
		"Alert short/critical",
		"SetPermits short=8", "SetBatch short=16",
		"SetPermits long=6",                   // the pin: long's own shrink
		"ThrottleLong 4", "SetPermits long=3", // the short pool throttles: 12/4
		"ThrottleLong 1", "SetPermits long=6", // throttle lifted: long stays shrunk
	}, r.actions())
	require.Equal(t, LevelShrink, shortLevel(st))
	require.Equal(t, 6, st.Pools[1].Permits)
}

// Between the thresholds the healer holds: no escalation, no step back.
func TestHealingWarnZoneHolds(t *testing.T) {
	r := newHealRun(t, concat(repeat(critical, 1), repeat(warnTail, 8))...)
	st := r.run(healingSettings())
	require.Equal(t, LevelShrink, shortLevel(st))
	require.Equal(t, []string{"Alert short/critical", "SetPermits short=8", "SetBatch short=16"}, r.actions())
}

func TestHealingIgnoresATailOfFewSamples(t *testing.T) {
	few := critical
	few.Samples = 10
	few.KVCacheUsage = 0.3
	r := newHealRun(t, repeat(few, 4)...)
	st := r.run(healingSettings())
	require.Empty(t, r.actions())
	require.Equal(t, LevelNormal, shortLevel(st))
}

func TestHealingQueueDepthAndTimeoutsAreCritical(t *testing.T) {
	deep := healthy
	deep.QueueDepth = 150
	timeouts := healthy
	timeouts.Requests, timeouts.Timeouts, timeouts.TimeoutRate = 100, 10, 0.1
	r := newHealRun(t, deep, timeouts)
	st := r.run(healingSettings())
	require.Equal(t, LevelThrottle, shortLevel(st))
}

func TestHealingFailedActionIsRetriedNextPoll(t *testing.T) {
	r := newHealRun(t, repeat(critical, 2)...)
	r.fail[actSetPermits] = 3 // every attempt of the first poll's call
	st := r.run(healingSettings())
	require.Equal(t, LevelShrink, shortLevel(st), "the second poll succeeds")
	var failed int
	for _, d := range st.Decisions {
		if d.Action == actSetPermits && d.Error != "" {
			failed++
		}
	}
	require.Equal(t, 1, failed, "the failure is recorded as a decision")
}

func TestHealingPauseResumeAndOverride(t *testing.T) {
	r := newHealRun(t, repeat(critical, 6)...)
	r.env.RegisterDelayedCallback(func() { r.env.SignalWorkflow(SignalPause, nil) }, 5*time.Second)
	r.env.RegisterDelayedCallback(func() { r.env.SignalWorkflow(SignalResume, nil) }, 25*time.Second)
	r.env.RegisterDelayedCallback(func() { r.env.SignalWorkflow(SignalOverride, OverrideSignal{Pool: "long", Level: LevelThrottle}) }, 35*time.Second)
	var mid HealingStatus
	r.env.RegisterDelayedCallback(func() {
		v, err := r.env.QueryWorkflow(QueryHealing)
		require.NoError(t, err)
		require.NoError(t, v.Get(&mid))
	}, 26*time.Second)
	st := r.run(healingSettings())
	// Poll 1 (t=0) escalates; polls at 10 s and 20 s are paused; 30 s, 40 s
	// and 50 s escalate again. The long pool is pinned at throttle.
	require.Equal(t, LevelShed, shortLevel(st))
	require.True(t, st.Pools[1].Overridden)
	require.Equal(t, LevelThrottle, st.Pools[1].Level)
	require.False(t, mid.Paused)
	require.Equal(t, LevelShrink, mid.Pools[0].Level, "nothing was done while paused")
	require.Contains(t, r.actions(), "SetPermits long=2", "the override applied each level up to its pin")
}

// The state survives ContinueAsNew: a new run starts where the last ended.
func TestHealingContinuesAsNewWithItsState(t *testing.T) {
	r := newHealRun(t, repeat(critical, 2)...)
	st := r.run(healingSettings())
	require.Equal(t, LevelThrottle, shortLevel(st))
	require.EqualValues(t, 2, st.Polls)

	r2 := newHealRun(t, repeat(healthy, 3)...)
	set := healingSettings()
	set.PollsPerRun = 3
	r2.env.ExecuteWorkflow(HealingWorkflowName, HealingInput{Settings: set, State: &st})
	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(r2.env.GetWorkflowError(), &can))
	var next HealingInput
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	require.Equal(t, LevelShrink, next.State.Pools[0].Level, "three healthy polls in the new run step back from where the old one was")
	require.EqualValues(t, 5, next.State.Polls)
	require.Equal(t, []string{"ThrottleLong 1", "SetPermits long=4"}, r2.actions())
}

// In a collapse P50 grows with P99 and the ratio looks tame; an absolute
// P99 bound still calls it critical.
func TestHealingCriticalP99CatchesACollapse(t *testing.T) {
	collapse := activities.PoolHealth{Samples: 500, P50Ms: 1200, P99Ms: 3100, Ratio: 2.6, KVCacheUsage: 0.3}
	r := newHealRun(t, repeat(collapse, 2)...)
	st := r.run(healingSettings())
	require.Equal(t, LevelNormal, shortLevel(st), "without the bound a collapse only warns")
	require.Equal(t, []string{"Alert short/warn"}, r.actions())

	set := healingSettings()
	set.CriticalP99 = 2 * time.Second
	r = newHealRun(t, repeat(collapse, 2)...)
	st = r.run(set)
	require.Equal(t, LevelThrottle, shortLevel(st))
}

// New settings by signal apply from the next poll on; the same settings
// again (every worker sends its own at start) record nothing.
func TestHealingTakesNewSettingsBySignal(t *testing.T) {
	r := newHealRun(t, repeat(critical, 3)...)
	set := healingSettings()
	set.PollsPerRun = 3
	changed := set
	changed.Pools = append([]PoolBounds(nil), set.Pools...)
	changed.Pools[0].BaseReplicas, changed.Pools[0].MaxReplicas = 4, 8
	changed.CriticalRatio = 10 // poll 3's 8× tail is no longer critical
	r.env.RegisterDelayedCallback(func() { r.env.SignalWorkflow(SignalSettings, set) }, 5*time.Second)
	r.env.RegisterDelayedCallback(func() { r.env.SignalWorkflow(SignalSettings, changed) }, 15*time.Second)
	r.env.ExecuteWorkflow(HealingWorkflowName, HealingInput{Settings: set})
	var can *workflow.ContinueAsNewError
	require.True(t, errors.As(r.env.GetWorkflowError(), &can), "%v", r.env.GetWorkflowError())
	var next HealingInput
	require.NoError(t, converter.GetDefaultDataConverter().FromPayloads(can.Input, &next))
	require.Equal(t, changed, next.Settings, "the new settings are carried over continue-as-new")
	var settings int
	for _, d := range next.State.Decisions {
		if d.Action == "settings" {
			settings++
		}
	}
	require.Equal(t, 1, settings, "only the change is recorded")
	require.Equal(t, LevelThrottle, shortLevel(*next.State), "poll 3 is a warning under the new threshold")
	require.Equal(t, 2, next.State.Pools[0].Replicas, "a pool at a level keeps what was applied until it changes level")
}

// A pool that has to escalate again right after stepping back holds its
// level twice as long the next time, and is forgiven once it has held its
// baseline for a whole hold.
func TestHealingFlappingDoublesTheHold(t *testing.T) {
	levelsAt := func(st HealingState) []int {
		var out []int
		for _, d := range st.Decisions {
			if d.Action == "level" {
				out = append(out, d.To)
			}
		}
		return out
	}
	script := concat(
		repeat(critical, 1), repeat(healthy, 3), // up, back after 3
		repeat(critical, 1), repeat(healthy, 5), // up again: 5 healthy polls are not enough now
	)
	r := newHealRun(t, script...)
	st := r.run(healingSettings())
	require.Equal(t, []int{1, 0, 1}, levelsAt(st))
	require.Equal(t, 6, st.Pools[0].Hold)

	r = newHealRun(t, concat(script, repeat(healthy, 1+6))...)
	st = r.run(healingSettings())
	require.Equal(t, []int{1, 0, 1, 0}, levelsAt(st), "the sixth healthy poll steps back")
	require.Equal(t, 0, st.Pools[0].Hold, "six more at the baseline: the hold is back to healthy_polls")
	require.False(t, st.Pools[0].SteppedBack)

	// Back at the baseline and healthy for a whole hold before the next
	// incident: not a flap, the hold stays healthy_polls.
	r = newHealRun(t, concat(repeat(critical, 1), repeat(healthy, 3+3), repeat(critical, 1), repeat(healthy, 3))...)
	st = r.run(healingSettings())
	require.Equal(t, []int{1, 0, 1, 0}, levelsAt(st))
	require.Equal(t, 0, st.Pools[0].Hold)

	var cycles []activities.PoolHealth
	for _, hold := range []int{3, 6, 12, 24, 24} {
		cycles = concat(cycles, repeat(critical, 1), repeat(healthy, hold))
	}
	r = newHealRun(t, concat(cycles, repeat(critical, 1))...)
	st = r.run(healingSettings())
	require.Equal(t, []int{1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1}, levelsAt(st))
	require.Equal(t, maxHoldFactor*3, st.Pools[0].Hold, "the hold is bounded")
}

// Every field of HealingSettings counts in sameSettings: a field added to
// the struct and not to the comparison fails here.
func TestSameSettingsSeesEveryField(t *testing.T) {
	base := healingSettings()
	require.True(t, sameSettings(base, healingSettings()))
	v := reflect.ValueOf(&base).Elem()
	for i := 0; i < v.NumField(); i++ {
		changed := healingSettings()
		f := reflect.ValueOf(&changed).Elem().Field(i)
		switch f.Kind() {
		case reflect.Int, reflect.Int64:
			f.SetInt(f.Int() + 1)
		case reflect.Float64:
			f.SetFloat(f.Float() + 1)
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Slice:
			changed.Pools = append([]PoolBounds(nil), changed.Pools...)
			changed.Pools[0].MaxReplicas++
		default:
			t.Fatalf("field %s: kind %s not handled by this test", v.Type().Field(i).Name, f.Kind())
		}
		require.False(t, sameSettings(base, changed), "field %s", v.Type().Field(i).Name)
	}
}

// A pool with a backend ejected by its circuit breaker is worth an alert;
// one with every backend ejected is critical, which scales it out.
func TestHealingEjectedBackends(t *testing.T) {
	some, all := healthy, healthy
	some.Endpoints, some.Ejected = 2, 1
	all.Endpoints, all.Ejected = 2, 2
	r := newHealRun(t, some, some, all)
	st := r.run(healingSettings())
	require.Equal(t, []string{
		"Alert short/warn",
		"Alert short/critical", "SetPermits short=8", "SetBatch short=16",
	}, r.actions())
	require.Equal(t, LevelShrink, shortLevel(st))
}

// Told to stop (a worker started with healing disabled), the healer
// undoes what it applied, one level a poll and whatever the pools'
// health, reads no more health, and ends once every pool is normal. A
// settings signal (a worker with healing enabled) before then cancels the
// stop.
func TestHealingStopStepsBackAndEnds(t *testing.T) {
	r := newHealRun(t, repeat(critical, 20)...)
	r.env.RegisterDelayedCallback(func() { r.env.SignalWorkflow(SignalStop, nil) }, 25*time.Second)
	r.env.ExecuteWorkflow(HealingWorkflowName, HealingInput{Settings: healingSettings()})
	require.True(t, r.env.IsWorkflowCompleted())
	require.NoError(t, r.env.GetWorkflowError(), "a stopped healer completes, it does not continue as new")
	var st HealingStatus
	require.NoError(t, r.env.GetWorkflowResult(&st))
	for _, p := range st.Pools {
		require.Equal(t, LevelNormal, p.Level, "pool %s", p.Pool)
	}
	short := st.Pools[0]
	require.Equal(t, 16, short.Permits, "the short pool's permits are back at base")
	require.Equal(t, 2, short.Replicas, "and its replicas")
	require.Equal(t, 3, r.polls, "health is read only before the stop (polls at 0, 10 and 20 s)")
	require.Equal(t, "stop", st.Decisions[len(st.Decisions)-1].Action)

	r = newHealRun(t, repeat(critical, 6)...)
	r.env.RegisterDelayedCallback(func() { r.env.SignalWorkflow(SignalStop, nil) }, 5*time.Second)
	set := healingSettings()
	set.WarnRatio, set.PollsPerRun = 3, 6 // what run sends as the workflow's own
	r.env.RegisterDelayedCallback(func() { r.env.SignalWorkflow(SignalSettings, set) }, 7*time.Second)
	st2 := r.run(set)
	require.False(t, st2.Stopping)
	require.Equal(t, LevelShed, shortLevel(st2), "healing went on after the cancelled stop")
}

// A pool critical for its queue (timeouts, depth) while its backends' tail
// is fine is starved: the healer never cuts its permits, batch or (for the
// long pool) throttles it; it goes on to what adds capacity or sheds. The
// same pool critical for its tail is shrunk as before.
func TestHealingSparesAStarvedPool(t *testing.T) {
	starved := healthy
	starved.Requests, starved.Timeouts, starved.TimeoutRate = 100, 72, 0.72
	r := newHealRun(t, repeat(healthy, 5)...)
	r.long = repeat(starved, 5)
	st := r.run(healingSettings())
	require.Equal(t, []string{"Alert long/critical", "Shed long", "Shed long"}, r.actions())
	require.Equal(t, LevelShed, st.Pools[1].Level)
	require.Equal(t, 4, st.Pools[1].Permits, "the starved pool kept its permits")
	var skipped []string
	for _, d := range st.Decisions {
		if strings.HasPrefix(d.Reason, "skipped") {
			skipped = append(skipped, d.Action)
		}
	}
	require.Contains(t, skipped, actSetPermits)
	require.Contains(t, skipped, actThrottleLong)

	tail := newHealRun(t, repeat(healthy, 1)...)
	tail.long = repeat(critical, 1)
	tail.run(healingSettings())
	require.Equal(t, []string{"Alert long/critical", "SetPermits long=2"}, tail.actions())
}

// A pool critical for its backends' tail whose clients still get their
// first tokens within its TTFT SLO (the P99 of the ttft series) is held,
// not cut: cutting it would cost the long pool's clients and give its own
// nothing. Past the SLO the healer acts as before.
func TestHealingHoldsWhileClientsAreServed(t *testing.T) {
	set := healingSettings()
	set.Pools[0].TTFTSLO = time.Second
	served := critical
	served.TTFTSamples, served.TTFTP99Ms = 500, 800
	r := newHealRun(t, repeat(served, 4)...)
	st := r.run(set)
	require.Equal(t, []string{"Alert short/warn"}, r.actions())
	require.Equal(t, LevelNormal, shortLevel(st))

	missed := critical
	missed.TTFTSamples, missed.TTFTP99Ms = 500, 1500
	r = newHealRun(t, missed)
	r.run(set)
	require.Equal(t, []string{"Alert short/critical", "SetPermits short=8", "SetBatch short=16"}, r.actions())
}
