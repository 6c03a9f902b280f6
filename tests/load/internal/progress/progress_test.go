package progress

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/tests/testenv"
)

// lines are the lines written to b so far.
func lines(b *testenv.SyncBuffer) []string {
	return strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
}

func TestProgressTickerPrintsEveryIntervalUntilStopped(t *testing.T) {
	var out testenv.SyncBuffer
	calls := 0
	p := Start(&out, "heal", 10*time.Millisecond, func() string {
		calls++
		return fmt.Sprintf("phase=on n=%d", calls)
	})
	deadline := time.Now().Add(5 * time.Second)
	for len(lines(&out)) < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	p.Stop()
	got := lines(&out)
	if len(got) < 3 {
		t.Fatalf("after 5s: %d lines, want 3 or more: %q", len(got), out.String())
	}
	line := regexp.MustCompile(`^\[heal\] \d+s phase=on n=(\d+)$`)
	for i, l := range got {
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("line %d %q is not \"[heal] <seconds>s <status>\"", i, l)
		}
		if m[1] != fmt.Sprint(i+1) {
			t.Errorf("line %d is the status's call %s, want %d", i, m[1], i+1)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if after := lines(&out); len(after) != len(got) {
		t.Errorf("%d lines printed after Stop returned", len(after)-len(got))
	}
	p.Stop() // a second Stop is harmless
}

func TestProgressTickerStopsBeforeItsFirstLine(t *testing.T) {
	var out testenv.SyncBuffer
	p := Start(&out, "burst", time.Hour, func() string { return "never" })
	done := make(chan struct{})
	go func() { p.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("Stop did not return within a second")
	}
	if s := out.String(); s != "" {
		t.Errorf("printed %q before its first interval", s)
	}
}

func TestMeterLine(t *testing.T) {
	var m Meter
	if got := m.String(); got != "phase=starting" {
		t.Errorf("before a phase: %q", got)
	}
	m.Enter("closed", 10)
	m.Add(3)
	m.Fail()
	got := m.String()
	if !regexp.MustCompile(`^phase=closed for=\d+s done=3/10 rate=[0-9.]+/s errors=1$`).MatchString(got) {
		t.Errorf("counted phase: %q", got)
	}
	m.Enter("wrk-8conns", -1)
	if got := m.String(); !regexp.MustCompile(`^phase=wrk-8conns for=\d+s$`).MatchString(got) {
		t.Errorf("a phase counted elsewhere: %q, want no counts (the last phase's were reset)", got)
	}
	if m.Current() != "wrk-8conns" {
		t.Errorf("current phase %q", m.Current())
	}
}
