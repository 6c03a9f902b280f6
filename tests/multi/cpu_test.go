package multi

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// cpuByPart is the CPU time (user + system, seconds) every process on the
// machine has used so far, summed by the part of a stack it is: what the
// goodput comparison divides by the answers to say which part limits.
// Both stacks run on this machine at once; only the one under load
// moves.
func cpuByPart() map[string]float64 {
	parts := map[string]float64{}
	self := os.Getpid()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(d, "stat"))
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join(d, "cmdline"))
		part := partOf(pid == self, string(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
		if part == "" {
			continue
		}
		// Fields after the command's closing parenthesis: utime and stime
		// are the 12th and 13th, in clock ticks (100 a second on Linux).
		rest := string(stat[bytes.LastIndexByte(stat, ')')+2:])
		f := strings.Fields(rest)
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		parts[part] += (ut + st) / 100
	}
	return parts
}

// partOf names the part a process plays, "" for none of the stacks'.
func partOf(self bool, cmd string) string {
	switch {
	case self:
		return "test process (clients, simulators)"
	case strings.Contains(cmd, "temporal-server"):
		return "Temporal server"
	case strings.Contains(cmd, "postgres"):
		return "PostgreSQL"
	case strings.Contains(cmd, "start-dev"):
		return "Temporal dev server (SQLite)"
	case strings.Contains(cmd, "redis-server") && strings.Contains(cmd, "[cluster]"):
		return "Redis Cluster (6 nodes)"
	case strings.Contains(cmd, "redis-server"):
		return "redis-server"
	case strings.Contains(cmd, "single-api"):
		return "sluice-api with its worker"
	case strings.Contains(cmd, "sluice-api"):
		return "sluice-api ×2"
	case strings.Contains(cmd, "sluice-worker"):
		return "sluice-worker ×2"
	}
	return ""
}

// cpuPerAnswer says, for the parts that used CPU between before and
// after, how many milliseconds each spent per answer, busiest first.
func cpuPerAnswer(before, after map[string]float64, answers int) string {
	type use struct {
		part string
		s    float64
	}
	var uses []use
	for part, s := range after {
		if d := s - before[part]; d > 0.05 {
			uses = append(uses, use{part, d})
		}
	}
	sort.Slice(uses, func(i, j int) bool { return uses[i].s > uses[j].s })
	var out []string
	for _, u := range uses {
		out = append(out, fmt.Sprintf("%s %.1f", u.part, 1000*u.s/float64(max(answers, 1))))
	}
	return strings.Join(out, ", ")
}
