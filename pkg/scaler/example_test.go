package scaler_test

import (
	"context"
	"fmt"
	"net/http/httptest"

	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/scaler"
)

// A healer adds one replica to the simulator when the tail gets long. The
// same code drives a Kubernetes Deployment with scaler.NewKubernetes, or
// anything else with scaler.NewWebhook.
func Example() {
	sim, err := llmsim.New(llmsim.DefaultConfig(), nil)
	if err != nil {
		panic(err)
	}
	defer sim.Close()
	srv := httptest.NewServer(sim.Handler())
	defer srv.Close()

	var s scaler.Scaler
	s, err = scaler.NewSimulator(scaler.SimulatorOptions{URL: srv.URL})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	before, err := s.Replicas(ctx)
	if err != nil {
		panic(err)
	}
	if err := s.Scale(ctx, before.Desired+1, "p99/p50 = 6.3 on pool short"); err != nil {
		panic(err)
	}
	after, err := s.Replicas(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("replicas %d -> %d, settled: %v\n", before.Desired, after.Desired, after.Settled())

	err = s.Scale(ctx, -1, "")
	fmt.Println(err, scaler.Permanent(err))
	// Output:
	// replicas 1 -> 2, settled: true
	// scale simulator: replica count refused: replicas must be >= 0, got -1 true
}
