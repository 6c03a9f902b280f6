package capacity

import (
	"math"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/request"
)

// exampleWorkload is the worked example's load: 800 QPS of 512 input + 256
// output tokens.
func exampleWorkload() Workload {
	return Workload{PeakQPS: 800, MeanInputTokens: 512, MeanOutputTokens: 256}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

func TestPlanGPUsWorkedExample(t *testing.T) {
	p, err := PlanGPUs(exampleWorkload(), A100Target())
	if err != nil {
		t.Fatal(err)
	}
	// (800 × 768) / (2000 × 0.8) × 1.3 = 614400 / 1600 × 1.3 = 384 × 1.3 =
	// 499.2, so 500 GPUs.
	if !near(p.LoadTokensPerSecond, 614400) || !near(p.BaseGPUs, 384) || !near(p.ExactGPUs, 499.2) || p.GPUs != 500 {
		t.Fatalf("plan = %+v, want load 614400, base 384, exact 499.2, 500 GPUs", p)
	}
	if u := p.Utilization(); !near(u, 614400.0/(500*2000)) {
		t.Errorf("utilisation = %v, want %v", u, 614400.0/(500*2000))
	}
	if u := p.UtilizationWith(0); !math.IsInf(u, 1) {
		t.Errorf("utilisation with no GPUs = %v, want +Inf", u)
	}
}

func TestPlanGPUs(t *testing.T) {
	tests := []struct {
		name  string
		w     Workload
		tgt   Target
		exact float64
		gpus  int
	}{
		{"exact integer stays", Workload{PeakQPS: 10, MeanInputTokens: 100, MeanOutputTokens: 100}, Target{TokensPerSecondPerGPU: 1000, Utilization: 1, Redundancy: 1}, 2, 2},
		{"float noise is not a GPU", Workload{PeakQPS: 800, MeanInputTokens: 512, MeanOutputTokens: 256}, Target{TokensPerSecondPerGPU: 2000, Utilization: 0.8, Redundancy: 1.25}, 480, 480},
		{"rounds up", Workload{PeakQPS: 1, MeanInputTokens: 10, MeanOutputTokens: 10}, Target{TokensPerSecondPerGPU: 15, Utilization: 1, Redundancy: 1}, 20.0 / 15, 2},
		{"tiny load still needs one", Workload{PeakQPS: 0.01, MeanInputTokens: 1, MeanOutputTokens: 1}, Target{TokensPerSecondPerGPU: 1000, Utilization: 0.5, Redundancy: 1}, 0.00004, 1},
		{"no input tokens", Workload{PeakQPS: 100, MeanOutputTokens: 30}, Target{TokensPerSecondPerGPU: 1000, Utilization: 0.75, Redundancy: 2}, 8, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := PlanGPUs(tt.w, tt.tgt)
			if err != nil {
				t.Fatal(err)
			}
			if !near(p.ExactGPUs, tt.exact) || p.GPUs != tt.gpus {
				t.Errorf("exact %v, GPUs %d; want %v, %d", p.ExactGPUs, p.GPUs, tt.exact, tt.gpus)
			}
		})
	}
}

func TestPlanGPUsRejects(t *testing.T) {
	good := A100Target()
	tests := []struct {
		name string
		w    Workload
		tgt  Target
		want []string
	}{
		{"zero qps", Workload{MeanInputTokens: 1, MeanOutputTokens: 1}, good, []string{"peak QPS must be > 0, got 0"}},
		{"negative input", Workload{PeakQPS: 1, MeanInputTokens: -1, MeanOutputTokens: 1}, good, []string{"mean input tokens must be >= 0, got -1"}},
		{"no output", Workload{PeakQPS: 1, MeanInputTokens: 1}, good, []string{"mean output tokens must be > 0, got 0"}},
		{"NaN rate", exampleWorkload(), Target{TokensPerSecondPerGPU: math.NaN(), Utilization: 0.8, Redundancy: 1}, []string{"tokens/s per GPU must be > 0, got NaN"}},
		{"utilisation above 1", exampleWorkload(), Target{TokensPerSecondPerGPU: 1, Utilization: 1.2, Redundancy: 1}, []string{"target utilisation must be in (0, 1], got 1.2"}},
		{"redundancy below 1", exampleWorkload(), Target{TokensPerSecondPerGPU: 1, Utilization: 1, Redundancy: 0.9}, []string{"redundancy must be >= 1, got 0.9"}},
		{"every bad field", Workload{}, Target{}, []string{"peak QPS", "mean output tokens", "tokens/s per GPU", "target utilisation", "redundancy"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := PlanGPUs(tt.w, tt.tgt)
			if err == nil {
				t.Fatal("no error")
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestPlanSplitDefaultShare(t *testing.T) {
	sp, err := PlanSplit(exampleWorkload(), A100Target(), DefaultSplit())
	if err != nil {
		t.Fatal(err)
	}
	// 70% of 499.2 is 349.44 and 30% is 149.76: 350 + 150.
	if sp.Pooled.GPUs != 500 || sp.Short.GPUs != 350 || sp.Long.GPUs != 150 || sp.Extra() != 0 {
		t.Fatalf("split = pooled %d, short %d, long %d, extra %d; want 500, 350, 150, 0",
			sp.Pooled.GPUs, sp.Short.GPUs, sp.Long.GPUs, sp.Extra())
	}
	if !near(sp.Short.TokenShare, 0.7) || !near(sp.Long.TokenShare, 0.3) {
		t.Errorf("shares %v / %v, want 0.7 / 0.3", sp.Short.TokenShare, sp.Long.TokenShare)
	}
	if sp.Short.Name != request.PoolShort || sp.Long.Name != request.PoolLong {
		t.Errorf("names %q, %q", sp.Short.Name, sp.Long.Name)
	}
}

func TestPlanSplit(t *testing.T) {
	tests := []struct {
		name               string
		w                  Workload
		tgt                Target
		split              Split
		pooled, short, lng int
		shortIn, shortOut  float64
		longShare          float64
	}{
		{
			// 10% of requests carry 2048+512 tokens; the other 90% then
			// average (512-204.8)/0.9 = 341.33 in and (256-51.2)/0.9 =
			// 227.56 out. Long load 80×2560 = 204800 of 614400 tokens/s.
			name: "by request fraction", w: exampleWorkload(), tgt: A100Target(),
			split:  Split{LongFraction: 0.1, LongInputTokens: 2048, LongOutputTokens: 512},
			pooled: 500, short: 333, lng: 167,
			shortIn: 307.2 / 0.9, shortOut: 204.8 / 0.9, longShare: 1.0 / 3,
		},
		{
			// Each pool rounds up on its own: 0.5 + 0.5 GPUs pooled is 1,
			// split it is 1 + 1.
			name: "rounding costs a GPU", w: Workload{PeakQPS: 1, MeanInputTokens: 50, MeanOutputTokens: 50},
			tgt:    Target{TokensPerSecondPerGPU: 200, Utilization: 1, Redundancy: 1},
			split:  Split{LongTokenShare: 0.5},
			pooled: 1, short: 1, lng: 1, shortIn: 50, shortOut: 50, longShare: 0.5,
		},
		{
			name: "long pool on faster GPUs", w: exampleWorkload(), tgt: A100Target(),
			split:  Split{LongTokenShare: 0.3, LongTokensPerSecondPerGPU: 4000},
			pooled: 500, short: 350, lng: 75, shortIn: 512, shortOut: 256, longShare: 0.3,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp, err := PlanSplit(tt.w, tt.tgt, tt.split)
			if err != nil {
				t.Fatal(err)
			}
			if sp.Pooled.GPUs != tt.pooled || sp.Short.GPUs != tt.short || sp.Long.GPUs != tt.lng {
				t.Errorf("GPUs pooled %d short %d long %d; want %d %d %d", sp.Pooled.GPUs, sp.Short.GPUs, sp.Long.GPUs, tt.pooled, tt.short, tt.lng)
			}
			if sp.Total() != tt.short+tt.lng || sp.Extra() != tt.short+tt.lng-tt.pooled {
				t.Errorf("total %d extra %d", sp.Total(), sp.Extra())
			}
			if !near(sp.Short.Workload.MeanInputTokens, tt.shortIn) || !near(sp.Short.Workload.MeanOutputTokens, tt.shortOut) {
				t.Errorf("short means %v+%v, want %v+%v", sp.Short.Workload.MeanInputTokens, sp.Short.Workload.MeanOutputTokens, tt.shortIn, tt.shortOut)
			}
			if !near(sp.Long.TokenShare, tt.longShare) || !near(sp.Short.TokenShare+sp.Long.TokenShare, 1) {
				t.Errorf("shares %v / %v, want long %v", sp.Short.TokenShare, sp.Long.TokenShare, tt.longShare)
			}
		})
	}
}

func TestPlanSplitRejects(t *testing.T) {
	tests := []struct {
		name  string
		split Split
		want  string
	}{
		{"nothing", Split{}, "give the long pool's request fraction (with its mean tokens) or its token share"},
		{"both", Split{LongFraction: 0.1, LongTokenShare: 0.3}, "not both"},
		{"share of 1", Split{LongTokenShare: 1}, "long token share must be in (0, 1), got 1"},
		{"fraction above 1", Split{LongFraction: 1.5, LongInputTokens: 1, LongOutputTokens: 1}, "long request fraction must be in (0, 1), got 1.5"},
		{"long heavier than the mean allows", Split{LongFraction: 0.5, LongInputTokens: 2048, LongOutputTokens: 256}, "carry more tokens than the overall means"},
		{"long without output", Split{LongFraction: 0.1, LongInputTokens: 1000}, "plan long pool: plan GPUs: mean output tokens must be > 0, got 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := PlanSplit(exampleWorkload(), A100Target(), tt.split)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

// UtilizationWith is Utilization for another replica count, such as one
// fewer.
func (p Plan) UtilizationWith(gpus int) float64 {
	return utilization(p.LoadTokensPerSecond, p.Target, gpus)
}
