package policy

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/request"
)

// A tier that configures no classes serves every request in the default
// class at the tier's weight, with no SLO, as tiers did before classes:
// auto and none resolve to it, and no other class is granted.
func TestTierWithoutClassesGrantsDefaultAtItsWeight(t *testing.T) {
	tier := Tier{Weight: 3}
	for _, asked := range []string{"", request.ClassAuto, request.ClassDefault} {
		c, ok := tier.Class(asked)
		if !ok || c != (Class{Name: request.ClassDefault, Rank: 1, Weight: 3}) {
			t.Errorf("Class(%q) = %+v, %v; want default at weight 3", asked, c, ok)
		}
	}
	for _, asked := range []string{request.ClassPriority, request.ClassFlex, "scale", "Default"} {
		if c, ok := tier.Class(asked); ok {
			t.Errorf("Class(%q) = %+v granted by a tier without classes", asked, c)
		}
	}
	if got := tier.Grants(); !reflect.DeepEqual(got, []string{request.ClassDefault}) {
		t.Errorf("Grants = %v", got)
	}
}

// A tier's classes carry their own weights and SLOs, and auto asks for
// the tier's default class.
func TestTierClassesResolve(t *testing.T) {
	tier := Tier{Weight: 3, DefaultClass: request.ClassFlex, Classes: map[string]ClassLimits{
		request.ClassPriority: {Weight: 8, TTFTSLO: time.Second, TPOTSLO: 50 * time.Millisecond},
		request.ClassFlex:     {Weight: 1},
	}}
	c, ok := tier.Class(request.ClassPriority)
	if want := (Class{Name: "priority", Rank: 0, Weight: 8, TTFTSLO: time.Second, TPOTSLO: 50 * time.Millisecond}); !ok || c != want {
		t.Errorf("priority = %+v, %v; want %+v", c, ok, want)
	}
	for _, asked := range []string{"", request.ClassAuto} {
		if c, ok := tier.Class(asked); !ok || c.Name != request.ClassFlex || c.Weight != 1 || c.Rank != 2 {
			t.Errorf("Class(%q) = %+v, %v; want flex", asked, c, ok)
		}
	}
	if _, ok := tier.Class(request.ClassDefault); ok {
		t.Error("default granted by a tier whose classes leave it out")
	}
	if got := tier.Grants(); !reflect.DeepEqual(got, []string{"priority", "flex"}) {
		t.Errorf("Grants = %v, want by rank", got)
	}
}

// Each problem with a tier's classes names its field.
func TestClassValidationNamesTheField(t *testing.T) {
	d := Deployment{MaxTokensLimit: 1000, Ledger: "off"}
	cases := []struct {
		name string
		tier Tier
		want string
	}{
		{"unknown class", Tier{Weight: 1, Classes: map[string]ClassLimits{"gold": {Weight: 1}, "default": {Weight: 1}}},
			"limits.tiers.free.classes.gold: unknown class (want one of priority, default, flex)"},
		{"auto is no class", Tier{Weight: 1, Classes: map[string]ClassLimits{"auto": {Weight: 1}, "default": {Weight: 1}}},
			"limits.tiers.free.classes.auto: unknown class"},
		{"weight", Tier{Weight: 1, Classes: map[string]ClassLimits{"default": {Weight: 0}}},
			"limits.tiers.free.classes.default.weight: must be > 0, got 0"},
		{"ttft", Tier{Weight: 1, Classes: map[string]ClassLimits{"default": {Weight: 1, TTFTSLO: -time.Second}}},
			"limits.tiers.free.classes.default.ttft_slo: must be >= 0 (0 = none), got -1s"},
		{"tpot", Tier{Weight: 1, Classes: map[string]ClassLimits{"default": {Weight: 1, TPOTSLO: -time.Millisecond}}},
			"limits.tiers.free.classes.default.tpot_slo: must be >= 0 (0 = none), got -1ms"},
		{"refuse late without a deadline", Tier{Weight: 1, Classes: map[string]ClassLimits{"default": {Weight: 1, RefuseLate: true}}},
			"limits.tiers.free.classes.default.refuse_late: needs a ttft_slo"},
		{"default not granted", Tier{Weight: 1, Classes: map[string]ClassLimits{"flex": {Weight: 1}}},
			`limits.tiers.free.default_class: names class "default", which limits.tiers.free.classes does not grant`},
		{"default without classes", Tier{Weight: 1, DefaultClass: "flex"},
			`limits.tiers.free.default_class: names class "flex", but the tier configures no classes (it grants only default)`},
		{"default auto", Tier{Weight: 1, DefaultClass: "auto"},
			`limits.tiers.free.default_class: unknown class "auto" (want one of priority, default, flex)`},
	}
	for _, tc := range cases {
		p := base()
		p.Limits.Tiers["free"] = tc.tier
		err := d.Check(p)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	p := base()
	p.Limits.Tiers["free"] = Tier{Weight: 1, DefaultClass: "flex", Classes: map[string]ClassLimits{"flex": {Weight: 1}, "priority": {Weight: 9, TTFTSLO: time.Second}}}
	if err := d.Check(p); err != nil {
		t.Errorf("valid classes: %v", err)
	}
}

// The admin API writes a tier's classes with readable durations, reads
// them back the same, and names a bad duration by its path.
func TestClassesJSONRoundTrip(t *testing.T) {
	p := base()
	p.Limits.Tiers["free"] = Tier{Weight: 2, DefaultClass: "flex", Classes: map[string]ClassLimits{
		"flex": {Weight: 1}, "priority": {Weight: 9, TTFTSLO: 800 * time.Millisecond, TPOTSLO: 40 * time.Millisecond, RefuseLate: true},
	}}
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"default_class":"flex"`, `"priority":{"weight":9,"ttft_slo":"800ms","tpot_slo":"40ms","refuse_late":true}`, `"flex":{"weight":1}`} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("json %s lacks %s", raw, want)
		}
	}
	var back Policy
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, p) {
		t.Fatalf("round trip %+v, want %+v", back.Limits.Tiers["free"], p.Limits.Tiers["free"])
	}
	err = json.Unmarshal([]byte(`{"tiers":{"x":{"weight":1,"classes":{"flex":{"weight":1,"ttft_slo":"soon"}}}}}`), &back)
	if err == nil || !strings.Contains(err.Error(), "tiers.x.classes.flex.ttft_slo") {
		t.Fatalf("bad duration: %v", err)
	}
}
