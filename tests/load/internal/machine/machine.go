// Package machine reads what the bench's process, its children and the
// whole machine use: resident memory and goroutines, and CPU time by
// process.
package machine

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Memory is the process's resident memory and Go's view of it.
type Memory struct {
	RSSKB      int64
	HeapInuse  uint64
	Goroutines int
}

func ReadMemory() Memory {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := Memory{HeapInuse: ms.HeapInuse, Goroutines: runtime.NumGoroutine()}
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return m
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				m.RSSKB, _ = strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return m
}

// CPU is CPU time used so far: by the whole machine, by this process
// (the bench, the API and its embedded worker) and by each child process
// (redis-server, the Temporal dev server) by name.
type CPU struct {
	at                time.Time
	Machine, machineT float64 // busy and total, in seconds summed over CPUs
	steal             float64 // time the hypervisor gave to someone else
	Self              float64
	Children          map[string]float64
}

// clockTick is USER_HZ, the unit of /proc CPU times (100 on Linux).
const clockTick = 100.0

func TakeCPU() CPU {
	s := CPU{at: time.Now(), Children: map[string]float64{}}
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
				s.Machine += v / clockTick
			}
		}
	}
	self := os.Getpid()
	if _, _, cpu, ok := ProcStat(self); ok {
		s.Self = cpu
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		comm, ppid, cpu, ok := ProcStat(pid)
		if ok && ppid == self {
			s.Children[comm] += cpu
		}
	}
	return s
}

// ProcStat reads a process's name, parent and CPU seconds (user+system).
func ProcStat(pid int) (comm string, ppid int, cpu float64, ok bool) {
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

// CPUBetween says where the machine's CPU went between two snapshots, in
// percent of one core.
func CPUBetween(a, b CPU) string {
	wall := b.at.Sub(a.at).Seconds()
	if wall <= 0 {
		return "no CPU figures"
	}
	pc := func(sec float64) string { return fmt.Sprintf("%.0f%%", 100*sec/wall) }
	var parts []string
	known := b.Self - a.Self
	parts = append(parts, "this process (bench + API + worker) "+pc(b.Self-a.Self))
	names := make([]string, 0, len(b.Children))
	for n := range b.Children {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		d := b.Children[n] - a.Children[n]
		known += d
		parts = append(parts, n+" "+pc(d))
	}
	busy := b.Machine - a.Machine
	parts = append(parts, "everything else on the machine "+pc(max(0, busy-known)))
	parts = append(parts, "stolen by the hypervisor "+pc(b.steal-a.steal))
	return fmt.Sprintf("machine %s of %d00%%: %s", pc(busy), runtime.NumCPU(), strings.Join(parts, ", "))
}
