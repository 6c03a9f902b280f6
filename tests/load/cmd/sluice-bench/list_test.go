package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchMKIsTheScenarioList: tests/load/bench.mk, the Makefile's bench
// targets, is what the scenario list generates, and the Makefile runs it.
func TestBenchMKIsTheScenarioList(t *testing.T) {
	root := filepath.Join("..", "..", "..", "..")
	raw, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(benchMK)))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(raw), makefile(specs); got != want {
		t.Errorf("%s is not what the scenario list generates: run make bench-targets\ngot:\n%s\nwant:\n%s", benchMK, got, want)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"include " + benchMK, "bench: bench-go $(BENCH_TARGETS)"} {
		if !strings.Contains(string(mk), "\n"+line+"\n") {
			t.Errorf("the Makefile has no line %q", line)
		}
	}
}

// TestScenarioNamesAreTheirOwn: no two scenarios, and no two make
// targets, share a name, and every scenario can be run from make.
func TestScenarioNamesAreTheirOwn(t *testing.T) {
	scenarios, targets := map[string]bool{}, map[string]bool{}
	for _, s := range specs {
		if scenarios[s.Name] {
			t.Errorf("two scenarios named %s", s.Name)
		}
		scenarios[s.Name] = true
		if len(s.Targets) == 0 {
			t.Errorf("scenario %s has no make target", s.Name)
		}
		for _, tg := range s.Targets {
			if targets[tg.Name] {
				t.Errorf("two make targets named bench-%s", tg.Name)
			}
			targets[tg.Name] = true
		}
	}
}
