// Command sluice-plan sizes an LLM fleet for a peak load with Sluice's
// capacity formula, splits it into a short-request and a
// long-request pool, and with -simulate checks the plan against the LLM
// simulator. See pkg/capacity and pkg/capacity/simcheck.
//
//	sluice-plan -qps 800 -input 512 -output 256 -tokens-per-gpu 2000
//	sluice-plan -qps 40 -input 512 -output 256 -tokens-per-gpu 2000 -simulate
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"text/tabwriter"
	"time"

	"github.com/sluice-dev/sluice/pkg/capacity"
	"github.com/sluice-dev/sluice/pkg/capacity/simcheck"
	"github.com/sluice-dev/sluice/pkg/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-plan:", err)
		os.Exit(2)
	}
}

type flags struct {
	w        capacity.Workload
	t        capacity.Target
	split    capacity.Split
	simulate bool
	sim      simcheck.Options
}

func parse(args []string, out io.Writer) (flags, error) {
	f := flags{w: capacity.Workload{PeakQPS: 800, MeanInputTokens: 512, MeanOutputTokens: 256}, t: capacity.A100Target(), sim: simcheck.DefaultOptions()}
	fs := flag.NewFlagSet("sluice-plan", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Float64Var(&f.w.PeakQPS, "qps", f.w.PeakQPS, "peak requests per second")
	fs.Float64Var(&f.w.MeanInputTokens, "input", f.w.MeanInputTokens, "mean input (prompt) tokens per request")
	fs.Float64Var(&f.w.MeanOutputTokens, "output", f.w.MeanOutputTokens, "mean output tokens per request")
	fs.Float64Var(&f.t.TokensPerSecondPerGPU, "tokens-per-gpu", f.t.TokensPerSecondPerGPU, "total (input+output) tokens/s one GPU sustains with a full batch")
	fs.Float64Var(&f.t.Utilization, "utilization", f.t.Utilization, "target utilisation at peak, in (0, 1]")
	fs.Float64Var(&f.t.Redundancy, "redundancy", f.t.Redundancy, "redundancy factor, >= 1")
	fs.Float64Var(&f.split.LongTokenShare, "long-share", 0, "long pool's share of the token load, in (0, 1); default 0.3 unless -long-fraction is given")
	fs.Float64Var(&f.split.LongFraction, "long-fraction", 0, "fraction of requests that are long, in (0, 1); needs -long-input and -long-output")
	fs.Float64Var(&f.split.LongInputTokens, "long-input", 0, "mean input tokens of a long request")
	fs.Float64Var(&f.split.LongOutputTokens, "long-output", 0, "mean output tokens of a long request")
	fs.Float64Var(&f.split.LongTokensPerSecondPerGPU, "long-tokens-per-gpu", 0, "tokens/s per GPU of the long pool (default: -tokens-per-gpu)")
	fs.BoolVar(&f.simulate, "simulate", false, "check the plan, and one GPU fewer, against the LLM simulator")
	fs.DurationVar(&f.sim.Duration, "sim-duration", f.sim.Duration, "simulated length of the peak load")
	fs.Float64Var(&f.sim.TimeScale, "time-scale", f.sim.TimeScale, "wall time per simulated time (0.1 runs 10x faster)")
	fs.IntVar(&f.sim.MaxReplicas, "sim-max-replicas", f.sim.MaxReplicas, "replicas to simulate at most; a larger fleet is checked through a slice with the same load per replica")
	fs.IntVar(&f.sim.MaxNumSeqs, "max-num-seqs", f.sim.MaxNumSeqs, "batch limit of a simulated replica")
	fs.Uint64Var(&f.sim.Seed, "seed", f.sim.Seed, "seed of the simulated arrivals")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if f.split.LongFraction == 0 && f.split.LongTokenShare == 0 {
		f.split.LongTokenShare = capacity.DefaultSplit().LongTokenShare
	}
	return f, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if version.Asked(args) {
		_, err := fmt.Fprintln(out, version.Line("sluice-plan"))
		return err
	}
	f, err := parse(args, out)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	sp, err := capacity.PlanSplit(f.w, f.t, f.split)
	if err != nil {
		return err
	}
	printPlan(out, sp)
	if !f.simulate {
		return nil
	}
	return simulate(ctx, out, f, sp.Pooled)
}

func printPlan(out io.Writer, sp capacity.SplitPlan) {
	p := sp.Pooled
	fmt.Fprintf(out, "peak load: %g QPS × (%g in + %g out) tokens = %.0f tokens/s\n",
		p.Workload.PeakQPS, p.Workload.MeanInputTokens, p.Workload.MeanOutputTokens, p.LoadTokensPerSecond)
	fmt.Fprintf(out, "GPUs = load / (%g tokens/s per GPU × %g utilisation) × %g redundancy, rounded up\n\n",
		p.Target.TokensPerSecondPerGPU, p.Target.Utilization, p.Target.Redundancy)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pool\ttoken share\tQPS\tin+out tokens\ttokens/s\ttokens/s/GPU\texact GPUs\tGPUs\tutilisation\t")
	row := func(name string, share float64, p capacity.Plan) {
		fmt.Fprintf(tw, "%s\t%.0f%%\t%.4g\t%.4g+%.4g\t%.0f\t%g\t%.2f\t%d\t%.0f%%\t\n", name, 100*share,
			p.Workload.PeakQPS, p.Workload.MeanInputTokens, p.Workload.MeanOutputTokens,
			p.LoadTokensPerSecond, p.Target.TokensPerSecondPerGPU, p.ExactGPUs, p.GPUs, 100*p.Utilization())
	}
	row("pooled", 1, p)
	row(sp.Short.Name, sp.Short.TokenShare, sp.Short.Plan)
	row(sp.Long.Name, sp.Long.TokenShare, sp.Long.Plan)
	fmt.Fprintf(tw, "short+long\t\t\t\t\t\t\t%d\t(%+d)\t\n", sp.Total(), sp.Extra())
	_ = tw.Flush()
}

func simulate(ctx context.Context, out io.Writer, f flags, p capacity.Plan) error {
	o := f.sim
	o.Workload = p.Workload
	o.TokensPerSecondPerGPU = p.Target.TokensPerSecondPerGPU
	fmt.Fprintf(out, "\nsimulation of the pooled plan: llmsim, %s of peak load in simulated time at time scale %g, open-loop Poisson arrivals\n", o.Duration, o.TimeScale)
	if p.GPUs > o.MaxReplicas {
		fmt.Fprintf(out, "(%d GPUs is more than %d simulated replicas: each run is a slice of %d replicas with the fleet's load per replica)\n",
			p.GPUs, o.MaxReplicas, o.MaxReplicas)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "run\tGPUs\tsimulated\toffered QPS\toffered tokens/s\tachieved tokens/s\tutilisation\tp50\tp99\tqueue end/max\tunfinished\tholds\t")
	runs := []struct {
		name string
		gpus int
	}{{"plan", p.GPUs}, {"one fewer", p.GPUs - 1}}
	var slow []string
	for _, r := range runs {
		if r.gpus < 1 {
			fmt.Fprintf(tw, "%s\t0\t\t\t\t\t\t\t\t\t\tno\t\n", r.name)
			continue
		}
		o.GPUs = r.gpus
		started := time.Now()
		res, err := simcheck.Run(ctx, o)
		if err != nil {
			return err
		}
		holds := "yes"
		switch {
		case res.ArrivalLag > time.Second:
			holds = "n/a (host lagged)"
		case !res.Holds:
			holds = "no"
		}
		lower := ""
		if res.Unfinished > 0 {
			lower = "≥"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.3g\t%.0f\t%.0f\t%.0f%%\t%s%s\t%s%s\t%d/%d\t%d\t%s\t\n", r.name, res.GPUs, res.Replicas,
			res.OfferedQPS, res.OfferedTokensPerSecond, res.ThroughputTokensPerSecond, 100*res.Utilization,
			lower, res.P50.Round(time.Millisecond), lower, res.P99.Round(time.Millisecond),
			res.QueueAtEnd, res.MaxQueue, res.Unfinished, holds)
		if res.ArrivalLag > time.Second {
			slow = append(slow, fmt.Sprintf("%s: arrivals ran up to %s (simulated) late after %s of wall time", r.name, res.ArrivalLag.Round(time.Millisecond), time.Since(started).Round(time.Millisecond)))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range slow {
		fmt.Fprintf(out, "warning: this host could not keep up with simulated time (%s); the run measured the host, not the plan: raise -time-scale\n", s)
	}
	return nil
}
