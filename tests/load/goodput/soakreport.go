package goodput

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-dev/sluice/tests/load/internal/figure"
	"github.com/sluice-dev/sluice/tests/load/internal/report"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// The soak benchmark's verdict and report: for each process, the trend of
// its memory over the judged window (the last -judge of the load) as the
// slope of a least-squares line and the growth that slope makes over the
// window, beside the spread and the peak; soak.md, soak.csv, soak.png.

// trend is a series' shape over a window.
type trend struct {
	n                     int
	slopePerMin, growth   float64 // per minute, and over the window
	lo, hi, median, first float64
	last                  float64
}

// trendOf fits y = a + b·t (t in minutes) to the points within [from, to]
// seconds; ys below 0 were not read and are left out.
func trendOf(at, ys []float64, from, to float64) trend {
	var tr trend
	var ts, vs []float64
	for i := range at {
		if at[i] >= from && at[i] <= to && ys[i] >= 0 {
			ts, vs = append(ts, at[i]/60), append(vs, ys[i])
		}
	}
	tr.n = len(vs)
	if tr.n == 0 {
		return tr
	}
	tr.first, tr.last = vs[0], vs[len(vs)-1]
	tr.lo, tr.hi = vs[0], vs[0]
	var mt, mv float64
	for i := range vs {
		tr.lo, tr.hi = min(tr.lo, vs[i]), max(tr.hi, vs[i])
		mt, mv = mt+ts[i], mv+vs[i]
	}
	mt, mv = mt/float64(tr.n), mv/float64(tr.n)
	var sxy, sxx float64
	for i := range vs {
		sxy += (ts[i] - mt) * (vs[i] - mv)
		sxx += (ts[i] - mt) * (ts[i] - mt)
	}
	if sxx > 0 {
		tr.slopePerMin = sxy / sxx
	}
	tr.growth = tr.slopePerMin * (ts[len(ts)-1] - ts[0])
	tr.median = medianOf(vs)
	return tr
}

func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// Flatness: a process with a chart limit may grow, by the trend over the
// judged window, at most flatShareOfLimit of that limit; one without (Redis
// and Temporal are not the chart's) flatShareOfMedian of its own median.
// Goroutines get flatShareOfMedian of their median, and at least
// flatGoroutines, since requests in flight come and go by the dozen.
const (
	flatShareOfLimit  = 0.05
	flatShareOfMedian = 0.10
	flatGoroutines    = 100
)

// series is one figure of one process over the whole run.
func series(samples []soakSample, proc string, get func(procSample) float64) (at, ys []float64) {
	for _, x := range samples {
		at, ys = append(at, x.at), append(ys, get(x.procs[proc]))
	}
	return at, ys
}

func rssOf(p procSample) float64        { return p.rssMiB }
func goroutinesOf(p procSample) float64 { return p.goroutines }
func cacheOf(p procSample) float64      { return p.cache }

func (s *soakScenario) Report(r *report.Report) error {
	samples := s.taken()
	from, to := s.loadEnd-s.judge.Seconds(), s.loadEnd
	answered := s.run.done.Load()
	r.Header(fmt.Sprintf("%d clients in a closed loop against %d short-pool permits for %s (answers of %d tokens), "+
		"API (embedded worker) and worker as processes of their own, a workflow cache of %d per process, events.ttl %s; every process sampled every %s, "+
		"judged on the last %s of the load", s.clients, s.permits, s.duration, s.tokens, s.cfg.WorkflowCacheSize(), s.cfg.Events.TTL, s.interval, s.judge))
	r.Strict = s.strict
	r.Linef("Answers: %d in %s (%.1f/s); outcomes: %s.", answered, s.duration, float64(answered)/s.duration.Seconds(), report.OutcomeLine(s.outcomes()))
	r.Linef("")
	r.Table("process", "RSS at 1 min", "RSS at end of load", "RSS after "+s.settle.String(), "peak RSS", "slope (last "+s.judge.String()+")", "spread (last "+s.judge.String()+")", "chart limit")
	for _, name := range soakProcesses {
		at, ys := series(samples, name, rssOf)
		all, w := trendOf(at, ys, 0, math.Inf(1)), trendOf(at, ys, from, to)
		r.Row(name, mibCell(valueNear(at, ys, 60)), mibCell(w.last), mibCell(all.last), mibCell(all.hi),
			fmt.Sprintf("%+.2f MiB/min", w.slopePerMin), mibCell(w.hi-w.lo), s.limitCell(name))
	}
	r.Linef("")
	r.Table("process", "goroutines at 1 min", "at end of load", "after "+s.settle.String(), "slope (last "+s.judge.String()+")", "workflow cache at end of load", "after "+s.settle.String())
	for _, name := range []string{procAPI, procWorker} {
		at, g := series(samples, name, goroutinesOf)
		_, c := series(samples, name, cacheOf)
		wg, wc := trendOf(at, g, from, to), trendOf(at, c, from, to)
		r.Row(name, fmt.Sprintf("%.0f", valueNear(at, g, 60)), fmt.Sprintf("%.0f", wg.last), fmt.Sprintf("%.0f", lastRead(g)),
			fmt.Sprintf("%+.1f/min", wg.slopePerMin), fmt.Sprintf("%.0f", wc.last), fmt.Sprintf("%.0f", lastRead(c)))
	}
	r.Linef("")
	s.goals(r, samples, from, to)
	return writeSoakReport(s, r, samples)
}

// goals adds, for each process, whether its memory was flat over the
// judged window and stayed under its chart limit, and for the API and
// worker whether their goroutines were flat.
func (s *soakScenario) goals(r *report.Report, samples []soakSample, from, to float64) {
	for _, name := range soakProcesses {
		at, ys := series(samples, name, rssOf)
		w, all := trendOf(at, ys, from, to), trendOf(at, ys, 0, math.Inf(1))
		if w.n < 3 {
			r.Goal(name+" memory flat", fmt.Sprintf("%d samples in the window", w.n), "at least 3", false)
			continue
		}
		allowed, of := flatShareOfMedian*w.median, fmt.Sprintf("%.0f%% of its median %s", 100*flatShareOfMedian, mibCell(w.median))
		if limit, ok := s.limits[name]; ok {
			allowed, of = flatShareOfLimit*limit, fmt.Sprintf("%.0f%% of its chart limit %s", 100*flatShareOfLimit, mibCell(limit))
		}
		r.Goal(name+" memory flat over the last "+s.judge.String(),
			fmt.Sprintf("%+.1f MiB by the trend (%+.2f MiB/min), spread %s", w.growth, w.slopePerMin, mibCell(w.hi-w.lo)),
			fmt.Sprintf("≤ %s, %s", mibCell(allowed), of), w.growth <= allowed)
		if limit, ok := s.limits[name]; ok {
			r.Goal(name+" peak RSS", mibCell(all.hi), "< chart limit "+mibCell(limit), all.hi < limit)
		}
	}
	for _, name := range []string{procAPI, procWorker} {
		at, g := series(samples, name, goroutinesOf)
		w := trendOf(at, g, from, to)
		allowed := max(flatGoroutines, flatShareOfMedian*w.median)
		r.Goal(name+" goroutines flat over the last "+s.judge.String(),
			fmt.Sprintf("%+.0f by the trend (%+.1f/min), %0.f–%0.f", w.growth, w.slopePerMin, w.lo, w.hi),
			fmt.Sprintf("≤ %.0f", allowed), w.n >= 3 && w.growth <= allowed)
	}
}

func (s *soakScenario) outcomes() map[string]int {
	s.run.mu.Lock()
	defer s.run.mu.Unlock()
	out := map[string]int{}
	for _, a := range s.run.ended {
		out[a.Kind]++
	}
	return out
}

func (s *soakScenario) limitCell(proc string) string {
	if l, ok := s.limits[proc]; ok {
		return mibCell(l)
	}
	return "not the chart's"
}

func mibCell(v float64) string {
	if v < 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f MiB", v)
}

// valueNear is the first read value at or after t seconds (-1: none).
func valueNear(at, ys []float64, t float64) float64 {
	for i := range at {
		if at[i] >= t && ys[i] >= 0 {
			return ys[i]
		}
	}
	return -1
}

// lastRead is the last value read (-1: none).
func lastRead(ys []float64) float64 {
	for i := len(ys) - 1; i >= 0; i-- {
		if ys[i] >= 0 {
			return ys[i]
		}
	}
	return -1
}

// chartMemoryLimits reads the memory limits of the chart's api and worker
// pods from its values file, in MiB.
func chartMemoryLimits(path string) (map[string]float64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the chart's values (-values): %w", err)
	}
	type pod struct {
		Resources struct {
			Limits struct {
				Memory string `yaml:"memory"`
			} `yaml:"limits"`
		} `yaml:"resources"`
	}
	var v struct {
		API    pod `yaml:"api"`
		Worker pod `yaml:"worker"`
	}
	if err := yaml.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	out := map[string]float64{}
	for proc, p := range map[string]pod{procAPI: v.API, procWorker: v.Worker} {
		q := p.Resources.Limits.Memory
		mi, err := quantityMiB(q)
		if err != nil {
			return nil, fmt.Errorf("%s: %s.resources.limits.memory: %w", path, proc, err)
		}
		out[proc] = mi
	}
	return out, nil
}

// quantityMiB reads a Kubernetes memory quantity such as 512Mi or 1Gi.
func quantityMiB(q string) (float64, error) {
	units := []struct {
		suffix string
		mib    float64
	}{{"Ki", 1.0 / 1024}, {"Mi", 1}, {"Gi", 1024}, {"k", 1e3 / (1 << 20)}, {"M", 1e6 / (1 << 20)}, {"G", 1e9 / (1 << 20)}}
	for _, u := range units {
		if n, ok := strings.CutSuffix(q, u.suffix); ok {
			f, err := strconv.ParseFloat(n, 64)
			if err != nil || f <= 0 {
				return 0, fmt.Errorf("want a quantity such as 512Mi, got %q", q)
			}
			return f * u.mib, nil
		}
	}
	return 0, fmt.Errorf("want a quantity such as 512Mi, got %q", q)
}

// soakColumns are soak.csv's columns, one row a process a sample; an
// unread figure is an empty cell.
var soakColumns = []string{"elapsed_s", "process", "rss_mib", "heap_inuse_mib", "goroutines", "workflow_cache"}

func soakCSV(samples []soakSample) []byte {
	var b bytes.Buffer
	b.WriteString(strings.Join(soakColumns, ",") + "\n")
	cell := func(v float64) string {
		if v < 0 {
			return ""
		}
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	for _, x := range samples {
		for _, name := range soakProcesses {
			p := x.procs[name]
			fmt.Fprintf(&b, "%.0f,%s,%s,%s,%s,%s\n", x.at, name, cell(p.rssMiB), cell(p.heapMiB), cell(p.goroutines), cell(p.cache))
		}
	}
	return b.Bytes()
}

// writeSoakReport writes soak.md, soak.csv and soak.png under -out.
func writeSoakReport(s *soakScenario, r *report.Report, samples []soakSample) error {
	if err := os.MkdirAll(s.out, 0o755); err != nil {
		return fmt.Errorf("report directory: %w", err)
	}
	var md bytes.Buffer
	md.WriteString("# Memory under a long steady load (sluice-bench soak)\n\n")
	fmt.Fprintf(&md, "Generated by `sluice-bench soak` (`make bench-soak`) on %s.\n\n", time.Now().UTC().Format(time.DateOnly))
	md.WriteString(report.RunLine() + "\n\n")
	fmt.Fprintf(&md, "Command: `%s`\n\n", report.CommandLine())
	fmt.Fprintf(&md, "Machine: %d CPUs; load average %s at the start, %s at the end. Everything (the bench's clients and the simulator, the API, the worker, Redis, the Temporal dev server) runs on it.\n\n", runtime.NumCPU(), report.LoadAtStart(), testenv.LoadAverage())
	fmt.Fprintf(&md, "What ran: %s.\n\n", r.What)
	md.WriteString("![memory, goroutines and workflow cache over the run](soak.png)\n\n")
	for _, l := range r.Lines {
		md.WriteString(l + "\n")
	}
	if err := os.WriteFile(filepath.Join(s.out, "soak.md"), md.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	csvPath := filepath.Join(s.out, "soak.csv")
	if err := os.WriteFile(csvPath, soakCSV(samples), 0o644); err != nil {
		return fmt.Errorf("write csv: %w", err)
	}
	png := filepath.Join(s.out, "soak.png")
	figure.DrawBeside("soak", png, func() error { return plotSoakCSV(csvPath, png, s.limits) })
	return nil
}
