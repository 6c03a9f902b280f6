package capacity_test

import (
	"fmt"

	"github.com/sluice-dev/sluice/pkg/capacity"
)

// The seed article's example, with its arithmetic done right.
func ExamplePlanSplit() {
	w := capacity.Workload{PeakQPS: 800, MeanInputTokens: 512, MeanOutputTokens: 256}
	sp, err := capacity.PlanSplit(w, capacity.SeedTarget(), capacity.SeedSplit())
	if err != nil {
		panic(err)
	}
	fmt.Printf("pooled: %.1f -> %d GPUs at %.0f%% utilisation\n", sp.Pooled.ExactGPUs, sp.Pooled.GPUs, 100*sp.Pooled.Utilization())
	fmt.Printf("short %d + long %d = %d (+%d)\n", sp.Short.GPUs, sp.Long.GPUs, sp.Total(), sp.Extra())
	// Output:
	// pooled: 499.2 -> 500 GPUs at 61% utilisation
	// short 350 + long 150 = 500 (+0)
}
