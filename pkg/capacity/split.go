package capacity

import (
	"errors"
	"fmt"
	"math"

	"github.com/sluice-dev/sluice/pkg/request"
)

// Split says how traffic divides between a short-request pool and a
// long-request pool. Give either LongFraction with the long requests' mean
// tokens, or only LongTokenShare.
type Split struct {
	// LongFraction is the fraction of requests routed to the long pool, in
	// (0, 1). With it, LongInputTokens and LongOutputTokens are the long
	// requests' means, and the short pool's means follow from the overall
	// ones: short = (overall - fraction × long) / (1 - fraction).
	LongFraction     float64
	LongInputTokens  float64
	LongOutputTokens float64
	// LongTokenShare is the long pool's share of the token load, in (0, 1),
	// when per-request figures are not known (DefaultSplit: 0.3). Both
	// pools are then assumed to see the overall request mix, so the share
	// of tokens is also the share of requests.
	LongTokenShare float64
	// LongTokensPerSecondPerGPU is the per-GPU rate of the long pool, whose
	// GPUs (and request mix) may differ from the short pool's; 0 means the
	// same rate as the short pool.
	LongTokensPerSecondPerGPU float64
}

// DefaultSplit gives the short pool 70% and the long pool 30% of the token
// load: sluice-plan's split when the request mix is not given.
func DefaultSplit() Split { return Split{LongTokenShare: 0.3} }

// PoolPlan is the plan of one pool.
type PoolPlan struct {
	Name string
	// TokenShare is the pool's share of the total token load.
	TokenShare float64
	Plan
}

// SplitPlan compares one pooled fleet with two isolated pools.
type SplitPlan struct {
	Pooled Plan
	Short  PoolPlan
	Long   PoolPlan
}

// Total is the GPU count of both pools together.
func (s SplitPlan) Total() int { return s.Short.GPUs + s.Long.GPUs }

// Extra is what isolation costs over the pooled plan, in GPUs. When both
// pools use the pooled rate it is never negative and at most 1: the pools'
// exact counts add up to the pooled one, but each is rounded up on its own.
// The formula cannot show the other cost of isolation: a pooled fleet's one
// margin covers a surge of either kind, while each isolated pool must keep
// its own redundancy for its own peak, so do not lower a pool's redundancy
// to win the rounding back.
func (s SplitPlan) Extra() int { return s.Total() - s.Pooled.GPUs }

// PlanSplit plans the pooled fleet and each pool separately, each by the
// same formula on its own load and rate, rounded up on its own.
func PlanSplit(w Workload, t Target, s Split) (SplitPlan, error) {
	pooled, err := PlanGPUs(w, t)
	if err != nil {
		return SplitPlan{}, err
	}
	short, long, err := s.workloads(w)
	if err != nil {
		return SplitPlan{}, fmt.Errorf("plan pool split: %w", err)
	}
	longTarget := t
	if s.LongTokensPerSecondPerGPU != 0 {
		longTarget.TokensPerSecondPerGPU = s.LongTokensPerSecondPerGPU
	}
	sp := SplitPlan{Pooled: pooled}
	total := w.TokensPerSecond()
	for _, pool := range []struct {
		out  *PoolPlan
		name string
		w    Workload
		t    Target
	}{{&sp.Short, request.PoolShort, short, t}, {&sp.Long, request.PoolLong, long, longTarget}} {
		p, err := PlanGPUs(pool.w, pool.t)
		if err != nil {
			return SplitPlan{}, fmt.Errorf("plan %s pool: %w", pool.name, err)
		}
		*pool.out = PoolPlan{Name: pool.name, TokenShare: pool.w.TokensPerSecond() / total, Plan: p}
	}
	return sp, nil
}

// workloads divides w into the short and the long pool's workloads.
func (s Split) workloads(w Workload) (short, long Workload, err error) {
	switch {
	case s.LongFraction != 0 && s.LongTokenShare != 0:
		return short, long, errors.New("give the long pool's request fraction or its token share, not both")
	case s.LongTokenShare != 0:
		f := s.LongTokenShare
		if !(f > 0 && f < 1) {
			return short, long, fmt.Errorf("long token share must be in (0, 1), got %v", f)
		}
		long = w
		long.PeakQPS = w.PeakQPS * f
		short = w
		short.PeakQPS = w.PeakQPS * (1 - f)
		return short, long, nil
	case s.LongFraction != 0:
		f := s.LongFraction
		if !(f > 0 && f < 1) {
			return short, long, fmt.Errorf("long request fraction must be in (0, 1), got %v", f)
		}
		long = Workload{PeakQPS: w.PeakQPS * f, MeanInputTokens: s.LongInputTokens, MeanOutputTokens: s.LongOutputTokens}
		short = Workload{
			PeakQPS:          w.PeakQPS * (1 - f),
			MeanInputTokens:  (w.MeanInputTokens - f*s.LongInputTokens) / (1 - f),
			MeanOutputTokens: (w.MeanOutputTokens - f*s.LongOutputTokens) / (1 - f),
		}
		// Float noise must not turn "all input is in long requests" into
		// a tiny negative mean.
		short.MeanInputTokens = clampZero(short.MeanInputTokens)
		if short.MeanInputTokens < 0 || !(short.MeanOutputTokens > 0) {
			return short, long, fmt.Errorf("long requests (%.0f%% of requests, %v+%v tokens) carry more tokens than the overall means (%v+%v) allow: the short requests' means would be %.1f+%.1f",
				f*100, s.LongInputTokens, s.LongOutputTokens, w.MeanInputTokens, w.MeanOutputTokens, short.MeanInputTokens, short.MeanOutputTokens)
		}
		return short, long, nil
	default:
		return short, long, errors.New("give the long pool's request fraction (with its mean tokens) or its token share")
	}
}

func clampZero(x float64) float64 {
	if math.Abs(x) < 1e-9 {
		return 0
	}
	return x
}
