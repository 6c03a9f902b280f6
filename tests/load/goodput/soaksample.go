package goodput

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/tests/load/internal/machine"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
)

// What the soak scenario samples, every -interval, of each process of the
// stack: its resident memory and, for Sluice's own processes, its Go heap,
// goroutines and Temporal workflow cache, read from its GET /metrics as a
// Prometheus server would scrape them.

// The processes sampled, in the report's order.
const (
	procAPI      = "api"
	procWorker   = "worker"
	procRedis    = "redis"
	procTemporal = "temporal"
)

var soakProcesses = []string{procAPI, procWorker, procRedis, procTemporal}

// procSample is one process at one moment; a negative figure was not
// read (not this process's kind, or it did not answer).
type procSample struct {
	rssMiB, heapMiB, goroutines, cache float64
}

func unread() procSample { return procSample{rssMiB: -1, heapMiB: -1, goroutines: -1, cache: -1} }

// soakSample is every process at one moment, seconds into the run.
type soakSample struct {
	at    float64
	procs map[string]procSample
}

// sampler reads the stack's processes.
type sampler struct {
	hc    *http.Client
	redis *redis.Client
	// metrics are the /metrics URLs of Sluice's processes; pids the
	// processes read from /proc.
	metrics map[string]string
	pids    map[string]int
}

// newSampler finds the stack's processes: the API and worker it started,
// redis-server by the pid it reports, the dev server as this process's
// child of that name.
func newSampler(ctx context.Context, st *stack.Stack) (*sampler, error) {
	if st.Procs == nil {
		return nil, fmt.Errorf("soak needs the API and worker in processes of their own")
	}
	s := &sampler{
		hc:      &http.Client{Timeout: 5 * time.Second},
		redis:   redis.NewClient(&redis.Options{Addr: st.Redis.Addr}),
		metrics: map[string]string{procAPI: st.Procs.APIMetrics, procWorker: st.Procs.WorkerMetrics},
		pids:    map[string]int{procAPI: st.Procs.API.Pid(), procWorker: st.Procs.Worker.Pid()},
	}
	info, err := s.redis.Info(ctx, "server").Result()
	if err != nil {
		return nil, fmt.Errorf("redis INFO server: %w", err)
	}
	if s.pids[procRedis] = int(infoValue(info, "process_id")); s.pids[procRedis] <= 0 {
		return nil, fmt.Errorf("redis INFO server has no process_id")
	}
	if s.pids[procTemporal] = childNamed(temporalComm); s.pids[procTemporal] == 0 {
		return nil, fmt.Errorf("no child process named %q (the Temporal dev server)", temporalComm)
	}
	return s, nil
}

func (s *sampler) close() { _ = s.redis.Close() }

// take reads every process once, at seconds into the run.
func (s *sampler) take(ctx context.Context, at float64) soakSample {
	out := soakSample{at: at, procs: map[string]procSample{}}
	for _, name := range soakProcesses {
		p := unread()
		p.rssMiB = rssMiB(s.pids[name])
		if url, ok := s.metrics[name]; ok {
			if m, err := s.scrape(ctx, url); err == nil {
				p.heapMiB = mibOf(m, "go_memstats_heap_inuse_bytes")
				p.goroutines = valueOf(m, "go_goroutines")
				p.cache = valueOf(m, "temporal_sticky_cache_size")
			}
		}
		out.procs[name] = p
	}
	// Redis's own account of its resident memory is the figure operators
	// read (INFO memory); /proc says the same of the same process.
	if info, err := s.redis.Info(ctx, "memory").Result(); err == nil {
		if v := infoValue(info, "used_memory_rss"); v > 0 {
			p := out.procs[procRedis]
			p.rssMiB = v / (1 << 20)
			out.procs[procRedis] = p
		}
	}
	return out
}

// scrape reads a /metrics page into the largest value of each family's
// series (a gauge each worker of a process reports, such as the cache
// they share, counts once).
func (s *sampler) scrape(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads Prometheus text: each family's largest sample.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		if i := strings.IndexByte(line, '{'); i >= 0 && i < len(name) {
			name = line[:i]
			j := strings.LastIndexByte(line, '}')
			if j < i {
				continue
			}
			rest = strings.TrimSpace(line[j+1:])
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		if old, ok := out[name]; !ok || v > old {
			out[name] = v
		}
	}
	return out, sc.Err()
}

func valueOf(m map[string]float64, name string) float64 {
	if v, ok := m[name]; ok {
		return v
	}
	return -1
}

func mibOf(m map[string]float64, name string) float64 {
	if v, ok := m[name]; ok {
		return v / (1 << 20)
	}
	return -1
}

// infoValue is a numeric field of a Redis INFO reply (-1: absent).
func infoValue(info, field string) float64 {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return f
			}
		}
	}
	return -1
}

// rssMiB is a process's VmRSS from /proc (-1: gone or unreadable).
func rssMiB(pid int) float64 {
	if pid <= 0 {
		return -1
	}
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, err := strconv.ParseFloat(f[0], 64)
				if err == nil {
					return kb / 1024
				}
			}
		}
	}
	return -1
}

// childNamed is the pid of this process's child of that name (0: none).
func childNamed(comm string) int {
	self := os.Getpid()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if c, ppid, _, ok := machine.ProcStat(pid); ok && ppid == self && c == comm {
			return pid
		}
	}
	return 0
}
