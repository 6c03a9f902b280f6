package main

import (
	"fmt"
	"strings"
	"time"
)

// sloTier is a tier of the benchmark: its weight, its SLO and the
// max_wait admission gives it.
type sloTier struct {
	name   string
	weight int
	// ttft bounds the first token, from the arrival; tpot the time per
	// output token after the first (0: no bound).
	ttft, tpot time.Duration
	maxWait    time.Duration
}

// sloTiers are the tiers in report order. Each max_wait is its TTFT
// bound: a request still waiting then has missed its SLO whatever comes
// next, and refusing it frees its client to go elsewhere at once, while
// one that gets a permit sooner may still meet it. The interactive one
// is not shorter because workflow timers under a second are not precise
// (admission.recheck_interval's floor for the same reason).
var sloTiers = [...]sloTier{
	{name: "interactive", weight: 5, ttft: time.Second, tpot: 100 * time.Millisecond, maxWait: time.Second},
	{name: "batch", weight: 1, ttft: time.Minute, maxWait: time.Minute},
}

const (
	tierInteractive = 0
	tierBatch       = 1
)

// sloTierNamed is the tier of that name.
func sloTierNamed(name string) (sloTier, error) {
	names := make([]string, len(sloTiers))
	for i, t := range sloTiers {
		if t.name == name {
			return t, nil
		}
		names[i] = t.name
	}
	return sloTier{}, fmt.Errorf("no tier %q (the slo benchmark's are %s)", name, strings.Join(names, ", "))
}

// pace is an answer's time per output token after the first; false when
// it has fewer than two tokens.
func pace(r chatResult) (time.Duration, bool) {
	if r.tokens < 2 {
		return 0, false
	}
	return (r.last - r.ttft) / time.Duration(r.tokens-1), true
}

// meets says whether a request was answered within the tier's SLO: done,
// its first token within ttft, and (with a tpot bound) its pace after
// the first token within tpot. Every benchmark that counts goodput
// within an SLO judges by it.
func (t sloTier) meets(r chatResult) bool {
	if r.kind != kindDone {
		return false
	}
	p, ok := pace(r)
	return r.ttft <= t.ttft && (t.tpot == 0 || !ok || p <= t.tpot)
}

// goal says the tier's SLO in words.
func (t sloTier) goal() string {
	if t.tpot == 0 {
		return fmt.Sprintf("TTFT <= %v", t.ttft)
	}
	return fmt.Sprintf("TTFT <= %v and <= %v a token after the first", t.ttft, t.tpot)
}
