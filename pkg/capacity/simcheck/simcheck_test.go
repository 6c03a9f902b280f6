package simcheck_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/capacity"
	"github.com/sluice-dev/sluice/pkg/capacity/simcheck"
)

func TestReplicaConfigHitsTheRate(t *testing.T) {
	tests := []struct {
		in, out, seqs int
		rate          float64
	}{
		{512, 256, 16, 2000},
		{64, 32, 8, 1000},
		{4096, 512, 32, 6000},
		{0, 100, 1, 50},
	}
	for _, tt := range tests {
		cfg := simcheck.ReplicaConfig(tt.in, tt.out, tt.seqs, tt.rate)
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%+v: %v", tt, err)
		}
		b := float64(tt.seqs)
		perRequest := float64(tt.out)*(cfg.DecodeBase.Seconds()/b+cfg.DecodePerSeq.Seconds()) + float64(tt.in)*cfg.PrefillPerToken.Seconds()
		if got := float64(tt.in+tt.out) / perRequest; math.Abs(got-tt.rate)/tt.rate > 1e-3 {
			t.Errorf("%+v: full-batch rate %.1f tokens/s, want %v", tt, got, tt.rate)
		}
		if need := tt.seqs * (tt.in + tt.out + 1 + cfg.BlockSize - 1) / cfg.BlockSize; cfg.KVCacheBlocks < need {
			t.Errorf("%+v: %d KV blocks cannot hold a full batch (%d)", tt, cfg.KVCacheBlocks, need)
		}
		if cfg.AnswerMinTokens != tt.out || cfg.AnswerMaxTokens != tt.out || cfg.MaxNumSeqs != tt.seqs {
			t.Errorf("%+v: answers %d..%d, batch %d", tt, cfg.AnswerMinTokens, cfg.AnswerMaxTokens, cfg.MaxNumSeqs)
		}
	}
}

// The planned fleet keeps up; a third of it falls behind. Only directions
// are asserted: the host's scheduling noise shows up in simulated time.
func TestRunPlanKeepsUpSmallerPlanFallsBehind(t *testing.T) {
	w := capacity.Workload{PeakQPS: 16, MeanInputTokens: 64, MeanOutputTokens: 32}
	plan, err := capacity.PlanGPUs(w, capacity.Target{TokensPerSecondPerGPU: 1000, Utilization: 0.8, Redundancy: 1.3})
	if err != nil {
		t.Fatal(err)
	}
	if plan.GPUs != 3 {
		t.Fatalf("plan = %d GPUs, want 3 (16 × 96 / 800 × 1.3 = 2.5)", plan.GPUs)
	}
	o := simcheck.DefaultOptions()
	o.Workload = w
	o.TokensPerSecondPerGPU = 1000
	o.MaxNumSeqs = 8
	o.Duration = 12 * time.Second
	// Slow enough that a busy two-core host under -race keeps up with
	// simulated time; faster, and the host, not the plan, falls behind.
	o.TimeScale = 0.1
	if testing.Short() {
		o.Duration = 8 * time.Second
	}
	ctx := context.Background()

	o.GPUs = plan.GPUs
	good, err := simcheck.Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	o.GPUs = 1
	bad, err := simcheck.Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plan: %+v", good)
	t.Logf("1 GPU: %+v", bad)

	if good.InputTokens != 64 || good.OutputTokens != 32 {
		t.Errorf("requests of %d+%d tokens, want 64+32", good.InputTokens, good.OutputTokens)
	}
	if good.Replicas != 3 || bad.Replicas != 1 || good.Sent == 0 || bad.Sent == 0 {
		t.Fatalf("replicas %d/%d, sent %d/%d", good.Replicas, bad.Replicas, good.Sent, bad.Sent)
	}
	if !good.Holds || good.Unfinished != 0 {
		t.Errorf("the plan did not keep up: queue %d at the end, %d unfinished", good.QueueAtEnd, good.Unfinished)
	}
	if bad.Holds || bad.QueueAtEnd <= good.QueueAtEnd {
		t.Errorf("one GPU at 154%% load kept up: queue %d at the end (plan: %d)", bad.QueueAtEnd, good.QueueAtEnd)
	}
	if bad.Utilization <= good.Utilization || bad.P99 <= good.P99 {
		t.Errorf("one GPU: utilisation %.2f, p99 %s; plan: %.2f, %s", bad.Utilization, bad.P99, good.Utilization, good.P99)
	}
}

// A fleet larger than MaxReplicas runs as a slice with the same load per
// replica.
func TestRunSlicesALargeFleet(t *testing.T) {
	o := simcheck.DefaultOptions()
	o.Workload = capacity.Workload{PeakQPS: 1000, MeanInputTokens: 20, MeanOutputTokens: 10}
	o.TokensPerSecondPerGPU = 1000
	o.GPUs = 100
	o.MaxReplicas = 2
	o.Duration = 2 * time.Second
	o.TimeScale = 0.02
	res, err := simcheck.Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.GPUs != 100 || res.Replicas != 2 || res.OfferedQPS != 20 {
		t.Fatalf("GPUs %d, replicas %d, offered %v QPS; want 100, 2, 20", res.GPUs, res.Replicas, res.OfferedQPS)
	}
}

func TestRunRejects(t *testing.T) {
	o := simcheck.DefaultOptions()
	o.MaxReplicas = 0
	o.TimeScale = 0
	_, err := simcheck.Run(context.Background(), o)
	for _, want := range []string{"simulate plan: ", "peak QPS must be > 0", "mean output tokens must be >= 1", "tokens/s per GPU must be > 0", "GPUs must be >= 1, got 0", "MaxReplicas must be in 1..64, got 0", "TimeScale must be > 0"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not contain %q", err, want)
		}
	}
}
