// Package capacity sizes an LLM fleet before launch: how many GPUs (model
// replicas) a peak load needs, and how to split them between a short-request
// pool and a long-request pool.
//
// Sluice's capacity formula is
//
//	GPUs = (peak QPS × mean tokens per request) / (tokens/s per GPU × target utilisation) × redundancy
//
// rounded up. A worked example: 800 QPS of 512 input + 256 output tokens on
// A100s at about 2000 tokens/s each, driven to 0.8 with a redundancy of 1.3,
// is 614400 / 1600 = 384 GPUs before redundancy and 499.2 after it, so 500
// GPUs.
//
// PlanSplit sizes a short and a long pool separately, each from its own
// load and per-GPU rate, each rounded up. The two together cost the pooled
// count or a little more: rounding up twice can add a GPU, and, which the
// formula cannot show, isolated pools no longer absorb each other's surges,
// so each keeps its own redundancy. The default split (70% / 30% of the
// token load, DefaultSplit) gives 350 + 150 for the worked example.
//
// Tokens here are total tokens, input plus output, and the per-GPU rate must
// be measured the same way: the total tokens per second one replica sustains
// with a full batch of the expected request mix. The formula has no term for
// the KV cache, latency targets or prefill/decode imbalance; it is a first
// sizing, to be checked against a load test (see package simcheck).
package capacity

import (
	"errors"
	"fmt"
	"math"
)

// Workload is the traffic a plan must carry at its peak.
type Workload struct {
	// PeakQPS is requests per second at the peak.
	PeakQPS float64
	// MeanInputTokens and MeanOutputTokens are per request.
	MeanInputTokens  float64
	MeanOutputTokens float64
}

// TokensPerRequest is the mean total (input + output) tokens of a request.
func (w Workload) TokensPerRequest() float64 { return w.MeanInputTokens + w.MeanOutputTokens }

// TokensPerSecond is the total token load at the peak.
func (w Workload) TokensPerSecond() float64 { return w.PeakQPS * w.TokensPerRequest() }

func (w Workload) validate() error {
	var errs []error
	if !positive(w.PeakQPS) {
		errs = append(errs, fmt.Errorf("peak QPS must be > 0, got %v", w.PeakQPS))
	}
	if !(w.MeanInputTokens >= 0) || math.IsInf(w.MeanInputTokens, 0) {
		errs = append(errs, fmt.Errorf("mean input tokens must be >= 0, got %v", w.MeanInputTokens))
	}
	// A request that generates nothing does not occupy a decode slot; the
	// formula would still count its prompt, but such a workload is a typo.
	if !positive(w.MeanOutputTokens) {
		errs = append(errs, fmt.Errorf("mean output tokens must be > 0, got %v", w.MeanOutputTokens))
	}
	return errors.Join(errs...)
}

// Target describes the hardware and how hard it may be driven.
type Target struct {
	// TokensPerSecondPerGPU is the total tokens per second one GPU (one
	// model replica) sustains on this request mix with a full batch.
	TokensPerSecondPerGPU float64
	// Utilization is the fraction of that rate the plan may use at the
	// peak, in (0, 1]; A100Target uses 0.8. Queueing delay grows sharply
	// as it approaches 1.
	Utilization float64
	// Redundancy multiplies the result to survive losing replicas and
	// forecast error; >= 1, A100Target uses 1.3.
	Redundancy float64
}

// A100Target is the target of the worked example and sluice-plan's
// default: an A100 at about 2000 tokens/s, driven to 80% at the peak, with
// 30% redundancy.
func A100Target() Target {
	return Target{TokensPerSecondPerGPU: 2000, Utilization: 0.8, Redundancy: 1.3}
}

func (t Target) validate() error {
	var errs []error
	if !positive(t.TokensPerSecondPerGPU) {
		errs = append(errs, fmt.Errorf("tokens/s per GPU must be > 0, got %v", t.TokensPerSecondPerGPU))
	}
	if !(t.Utilization > 0 && t.Utilization <= 1) {
		errs = append(errs, fmt.Errorf("target utilisation must be in (0, 1], got %v", t.Utilization))
	}
	if !(t.Redundancy >= 1) || math.IsInf(t.Redundancy, 0) {
		errs = append(errs, fmt.Errorf("redundancy must be >= 1, got %v", t.Redundancy))
	}
	return errors.Join(errs...)
}

// Plan is the GPU count for one workload.
type Plan struct {
	Workload Workload
	Target   Target
	// LoadTokensPerSecond is the token load at the peak.
	LoadTokensPerSecond float64
	// BaseGPUs is the load divided by the usable rate of one GPU, before
	// redundancy.
	BaseGPUs float64
	// ExactGPUs is BaseGPUs × redundancy, before rounding up.
	ExactGPUs float64
	// GPUs is ExactGPUs rounded up: the number to deploy.
	GPUs int
}

// Utilization is the fraction of the fleet's token rate the peak load uses
// with GPUs replicas: lower than the target when rounding or redundancy
// added replicas.
func (p Plan) Utilization() float64 { return utilization(p.LoadTokensPerSecond, p.Target, p.GPUs) }

func utilization(load float64, t Target, gpus int) float64 {
	if gpus <= 0 {
		return math.Inf(1)
	}
	return load / (float64(gpus) * t.TokensPerSecondPerGPU)
}

// PlanGPUs applies the formula to one workload.
func PlanGPUs(w Workload, t Target) (Plan, error) {
	if err := errors.Join(w.validate(), t.validate()); err != nil {
		return Plan{}, fmt.Errorf("plan GPUs: %w", err)
	}
	p := Plan{Workload: w, Target: t, LoadTokensPerSecond: w.TokensPerSecond()}
	p.BaseGPUs = p.LoadTokensPerSecond / (t.TokensPerSecondPerGPU * t.Utilization)
	p.ExactGPUs = p.BaseGPUs * t.Redundancy
	p.GPUs = roundUp(p.ExactGPUs)
	return p, nil
}

// roundUp is math.Ceil that forgives float noise: 384 × 1.25 may come out
// as 480.00000000000006, which must plan 480 GPUs, not 481.
func roundUp(x float64) int {
	n := int(math.Ceil(x - 1e-9))
	return max(n, 1)
}

func positive(x float64) bool { return x > 0 && !math.IsInf(x, 0) }
