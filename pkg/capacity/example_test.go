package capacity_test

import (
	"fmt"

	"github.com/sluice-dev/sluice/pkg/capacity"
)

// The worked example: 800 QPS of 512 input + 256 output tokens on A100s,
// pooled and split 70% / 30% of the token load.
func ExamplePlanSplit() {
	w := capacity.Workload{PeakQPS: 800, MeanInputTokens: 512, MeanOutputTokens: 256}
	sp, err := capacity.PlanSplit(w, capacity.A100Target(), capacity.DefaultSplit())
	if err != nil {
		panic(err)
	}
	fmt.Printf("pooled: %.1f -> %d GPUs at %.0f%% utilisation\n", sp.Pooled.ExactGPUs, sp.Pooled.GPUs, 100*sp.Pooled.Utilization())
	fmt.Printf("short %d + long %d = %d (+%d)\n", sp.Short.GPUs, sp.Long.GPUs, sp.Total(), sp.Extra())
	// Output:
	// pooled: 499.2 -> 500 GPUs at 61% utilisation
	// short 350 + long 150 = 500 (+0)
}
