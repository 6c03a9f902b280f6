package testenv

import (
	"bufio"
	"os"
	"strings"
)

// CleanEnv is this process's environment without SLUICE_* variables, for
// a Sluice process a test starts with a config of its own: the loader
// refuses SLUICE_* names it does not know (a test's own switches), and
// the test's config must not be overridden by the caller's shell.
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			env = append(env, kv)
		}
	}
	return env
}

// Tail is the last n lines of a log file, or, when it holds a panic, up to
// n lines from the panic's message on (the message comes before its
// stack); the error's text when the file cannot be read.
func Tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	for i, l := range lines {
		if strings.HasPrefix(l, "panic:") {
			return strings.Join(lines[i:min(i+n, len(lines))], "\n")
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// QuietLogger keeps a test's own Temporal client from logging, e.g. the
// reconnects a restarted or killed server causes.
type QuietLogger struct{}

func (QuietLogger) Debug(string, ...any) {}
func (QuietLogger) Info(string, ...any)  {}
func (QuietLogger) Warn(string, ...any)  {}
func (QuietLogger) Error(string, ...any) {}

// LoadAverage is the machine's 1, 5 and 15 minute load averages as
// /proc/loadavg gives them ("unknown" if it cannot be read): on a 2-core
// machine other processes move every figure a bench reports, so its
// report says how busy the machine was.
func LoadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	fields := strings.Fields(string(raw))
	if len(fields) < 3 {
		return "unknown"
	}
	return strings.Join(fields[:3], " ")
}
