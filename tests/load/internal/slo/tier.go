// Package slo is the tiers of the slo scenario and the SLO each promises;
// every scenario that counts answers within an SLO judges them by
// Tier.Meets.
package slo

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/tests/load/internal/chat"
)

// Tier is a tier of the benchmark: its weight, its SLO and the
// max_wait admission gives it.
type Tier struct {
	Name   string
	Weight int
	// TTFT bounds the first token, from the arrival; tpot the time per
	// output token after the first (0: no bound).
	TTFT, TPOT time.Duration
	MaxWait    time.Duration
}

// Tiers are the tiers in report order. Each max_wait is its TTFT
// bound: a request still waiting then has missed its SLO whatever comes
// next, and refusing it frees its client to go elsewhere at once, while
// one that gets a permit sooner may still meet it. The interactive one
// is not shorter because workflow timers under a second are not precise
// (admission.recheck_interval's floor for the same reason).
var Tiers = [...]Tier{
	{Name: "interactive", Weight: 5, TTFT: time.Second, TPOT: 100 * time.Millisecond, MaxWait: time.Second},
	{Name: "batch", Weight: 1, TTFT: time.Minute, MaxWait: time.Minute},
}

const (
	Interactive = 0
	Batch       = 1
)

// TierNamed is the tier of that name.
func TierNamed(name string) (Tier, error) {
	names := make([]string, len(Tiers))
	for i, t := range Tiers {
		if t.Name == name {
			return t, nil
		}
		names[i] = t.Name
	}
	return Tier{}, fmt.Errorf("no tier %q (the slo benchmark's are %s)", name, strings.Join(names, ", "))
}

// Pace is an answer's time per output token after the first; false when
// it has fewer than two tokens.
func Pace(r chat.Result) (time.Duration, bool) {
	if r.Tokens < 2 {
		return 0, false
	}
	return (r.Last - r.TTFT) / time.Duration(r.Tokens-1), true
}

// Meets says whether a request was answered within the tier's SLO: done,
// its first token within ttft, and (with a tpot bound) its pace after
// the first token within tpot. Every benchmark that counts goodput
// within an SLO judges by it.
func (t Tier) Meets(r chat.Result) bool {
	if r.Kind != chat.KindDone {
		return false
	}
	p, ok := Pace(r)
	return r.TTFT <= t.TTFT && (t.TPOT == 0 || !ok || p <= t.TPOT)
}

// Goal says the tier's SLO in words.
func (t Tier) Goal() string {
	if t.TPOT == 0 {
		return fmt.Sprintf("TTFT <= %v", t.TTFT)
	}
	return fmt.Sprintf("TTFT <= %v and <= %v a token after the first", t.TTFT, t.TPOT)
}
