package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// msFine is ms with the precision sub-millisecond latencies need.
func msFine(d time.Duration) string {
	return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond))
}

// latencies is a sorted sample of durations.
type latencies []time.Duration

func sorted(ds []time.Duration) latencies {
	s := append(latencies(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s
}

// at is the p-th percentile (0 < p <= 100) by the nearest-rank method.
func (l latencies) at(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	idx := int(float64(len(l))*p/100+0.999999) - 1
	idx = max(0, min(idx, len(l)-1))
	return l[idx]
}

func (l latencies) max() time.Duration {
	if len(l) == 0 {
		return 0
	}
	return l[len(l)-1]
}

// perSecond formats a rate with thousands separators.
func perSecond(n float64) string { return thousands(int64(n+0.5)) + "/s" }

func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// loadResult is what a run of requests measured.
type loadResult struct {
	sent    int
	elapsed time.Duration
	// lat is each answered request's latency. In an open loop it runs
	// from the request's scheduled start if its worker was still busy
	// with an earlier request then (the system made it wait: no
	// coordinated omission), else from when it was sent (the generator's
	// own timer slack is not the system's latency).
	lat latencies
	// late counts requests of an open loop sent more than a millisecond
	// after their scheduled time because their worker was busy.
	late int
	errs int
}

// rate is the requests answered without an error per second.
func (r loadResult) rate() float64 { return float64(len(r.lat)) / r.elapsed.Seconds() }

// sentRate is the requests sent per second.
func (r loadResult) sentRate() float64 { return float64(r.sent) / r.elapsed.Seconds() }

// closedLoop runs clients that each send their next request as soon as
// the previous one returned, for d. do is called with the client's index.
func closedLoop(ctx context.Context, d time.Duration, clients int, do func(ctx context.Context, client int) error) loadResult {
	start := time.Now()
	deadline := start.Add(d)
	return runWorkers(start, clients, func(c int) (t tally) {
		t.lat = make([]time.Duration, 0, 4096)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			t0 := time.Now()
			if err := do(ctx, c); err != nil {
				t.errs++
				continue
			}
			t.lat = append(t.lat, time.Since(t0))
		}
		return t
	})
}

// tally is what one worker of a load measured.
type tally struct {
	lat        []time.Duration
	late, errs int
}

// runWorkers runs work on n goroutines and adds up their tallies; the
// load's time runs from start until the last worker returned.
func runWorkers(start time.Time, n int, work func(w int) tally) loadResult {
	var mu sync.Mutex
	var res loadResult
	var all []time.Duration
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			t := work(w)
			mu.Lock()
			all = append(all, t.lat...)
			res.late += t.late
			res.errs += t.errs
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	res.sent = len(all) + res.errs
	res.lat = sorted(all)
	return res
}

// feed sends 0 to n-1 on the channel it returns, then closes it; it
// stops early when ctx is done.
func feed(ctx context.Context, n int) <-chan int {
	ch := make(chan int)
	go func() {
		defer close(ch)
		for i := 0; i < n; i++ {
			select {
			case ch <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

// paced issues requests at a fixed total rate for d, open loop: request i
// is due at start + i/rate whatever happened to earlier ones, spread over
// workers that each own every workers-th request. do is called with the
// worker's index.
func paced(ctx context.Context, rate float64, d time.Duration, workers int, do func(ctx context.Context, worker, i int) error) loadResult {
	total := int(rate * d.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now().Add(50 * time.Millisecond)
	return runWorkers(start, workers, func(w int) (t tally) {
		t.lat = make([]time.Duration, 0, total/workers+1)
		var prevDone time.Time
		for i := w; i < total && ctx.Err() == nil; i += workers {
			due := start.Add(time.Duration(i) * interval)
			if wait := time.Until(due); wait > 0 {
				time.Sleep(wait)
			}
			sent := time.Now()
			err := do(ctx, w, i)
			done := time.Now()
			from := sent
			if prevDone.After(due) {
				from = due
				if sent.Sub(due) > time.Millisecond {
					t.late++
				}
			}
			prevDone = done
			if err != nil {
				t.errs++
				continue
			}
			t.lat = append(t.lat, done.Sub(from))
		}
		return t
	})
}

// memory is the process's resident memory and Go's view of it.
type memory struct {
	rssKB      int64
	heapInuse  uint64
	goroutines int
}

func readMemory() memory {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := memory{heapInuse: ms.HeapInuse, goroutines: runtime.NumGoroutine()}
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return m
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				m.rssKB, _ = strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return m
}

func mib(bytes float64) string { return fmt.Sprintf("%.0f MiB", bytes/(1<<20)) }

// cpuSnap is CPU time used so far: by the whole machine, by this process
// (the bench, the API and its embedded worker) and by each child process
// (redis-server, the Temporal dev server) by name.
type cpuSnap struct {
	at                time.Time
	machine, machineT float64 // busy and total, in seconds summed over CPUs
	steal             float64 // time the hypervisor gave to someone else
	self              float64
	children          map[string]float64
}

// clockTick is USER_HZ, the unit of /proc CPU times (100 on Linux).
const clockTick = 100.0

func takeCPU() cpuSnap {
	s := cpuSnap{at: time.Now(), children: map[string]float64{}}
	if raw, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(raw), "\n")
		f := strings.Fields(line)
		// cpu user nice system idle iowait irq softirq steal …
		for i := 1; i < len(f) && i <= 8; i++ {
			v, _ := strconv.ParseFloat(f[i], 64)
			s.machineT += v / clockTick
			switch i {
			case 4, 5: // idle, iowait
			case 8:
				s.steal += v / clockTick
			default:
				s.machine += v / clockTick
			}
		}
	}
	self := os.Getpid()
	if _, _, cpu, ok := procStat(self); ok {
		s.self = cpu
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		comm, ppid, cpu, ok := procStat(pid)
		if ok && ppid == self {
			s.children[comm] += cpu
		}
	}
	return s
}

// procStat reads a process's name, parent and CPU seconds (user+system).
func procStat(pid int) (comm string, ppid int, cpu float64, ok bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, 0, false
	}
	s := string(raw)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", 0, 0, false
	}
	comm = s[open+1 : end]
	f := strings.Fields(s[end+1:])
	// f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return "", 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return comm, ppid, (u + st) / clockTick, true
}

// cpuBetween says where the machine's CPU went between two snapshots, in
// percent of one core.
func cpuBetween(a, b cpuSnap) string {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return "no CPU figures"
	}
	pc := func(sec float64) string { return fmt.Sprintf("%.0f%%", 100*sec/wall) }
	var parts []string
	known := b.self - a.self
	parts = append(parts, "this process (bench + API + worker) "+pc(b.self-a.self))
	names := make([]string, 0, len(b.children))
	for n := range b.children {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		d := b.children[n] - a.children[n]
		known += d
		parts = append(parts, n+" "+pc(d))
	}
	busy := b.machine - a.machine
	parts = append(parts, "everything else on the machine "+pc(max(0, busy-known)))
	parts = append(parts, "stolen by the hypervisor "+pc(b.steal-a.steal))
	return fmt.Sprintf("machine %s of %d00%%: %s", pc(busy), runtime.NumCPU(), strings.Join(parts, ", "))
}
