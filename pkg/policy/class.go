package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/request"
)

// ClassLimits is what a tier gives one service class (request.Classes)
// it grants. In JSON, written by Policy's MarshalJSON, the SLOs are
// duration strings ("800ms").
type ClassLimits struct {
	// Weight is the class's share in weighted fair queuing, in place of
	// the tier's: a request is queued with the weight of the class it is
	// served in.
	Weight int `yaml:"weight"`
	// TTFTSLO is the time to first token the class is meant to meet (0:
	// none); TPOTSLO the time per output token after it (0: none).
	TTFTSLO time.Duration `yaml:"ttft_slo"`
	TPOTSLO time.Duration `yaml:"tpot_slo"`
	// RefuseLate refuses a request of the class as soon as it cannot get
	// a permit within its TTFT SLO (its deadline, from its arrival):
	// early, when the wait estimated ahead of it is longer than what is
	// left, and at the latest at the deadline, instead of letting it hold
	// a place it cannot use. Needs TTFTSLO.
	RefuseLate bool `yaml:"refuse_late"`
}

// classDocument is ClassLimits' JSON form.
type classDocument struct {
	Weight     int    `json:"weight"`
	TTFTSLO    string `json:"ttft_slo,omitempty"`
	TPOTSLO    string `json:"tpot_slo,omitempty"`
	RefuseLate bool   `json:"refuse_late,omitempty"`
}

// classDocuments are a tier's classes in the admin API's form (nil for
// none).
func classDocuments(classes map[string]ClassLimits) map[string]classDocument {
	if len(classes) == 0 {
		return nil
	}
	out := make(map[string]classDocument, len(classes))
	for name, c := range classes {
		d := classDocument{Weight: c.Weight, RefuseLate: c.RefuseLate}
		if c.TTFTSLO != 0 {
			d.TTFTSLO = c.TTFTSLO.String()
		}
		if c.TPOTSLO != 0 {
			d.TPOTSLO = c.TPOTSLO.String()
		}
		out[name] = d
	}
	return out
}

// classesOf reads a tier's classes from the admin API's form; field is
// the tier's path, which an error names.
func classesOf(field string, docs map[string]classDocument) (map[string]ClassLimits, error) {
	if len(docs) == 0 {
		return nil, nil
	}
	out := make(map[string]ClassLimits, len(docs))
	for _, name := range slices.Sorted(maps.Keys(docs)) {
		d := docs[name]
		c := ClassLimits{Weight: d.Weight, RefuseLate: d.RefuseLate}
		for _, f := range []struct {
			name string
			in   string
			out  *time.Duration
		}{{"ttft_slo", d.TTFTSLO, &c.TTFTSLO}, {"tpot_slo", d.TPOTSLO, &c.TPOTSLO}} {
			if f.in == "" {
				continue
			}
			v, err := time.ParseDuration(f.in)
			if err != nil {
				return nil, fmt.Errorf("%s.classes.%s.%s: want a duration such as 800ms: %w", field, name, f.name, err)
			}
			*f.out = v
		}
		out[name] = c
	}
	return out, nil
}

// Class is the service class a request is served in, as its tier gives
// it: what admission weighs it by, what it is meant to meet, and its
// rank among the classes (0 the most urgent), which a scheduler or a
// backend's priority may go by.
type Class struct {
	Name    string
	Rank    int
	Weight  int
	TTFTSLO time.Duration
	TPOTSLO time.Duration
	// RefuseLate: refused once it cannot get a permit within TTFTSLO
	// (ClassLimits.RefuseLate).
	RefuseLate bool
}

// classes is what the tier grants: its own classes, or, when it
// configures none, the default class alone at the tier's weight with no
// SLO.
func (t Tier) classes() map[string]ClassLimits {
	if len(t.Classes) > 0 {
		return t.Classes
	}
	return map[string]ClassLimits{request.ClassDefault: {Weight: t.Weight}}
}

// defaultClass is the class of a request that names none or asks for
// request.ClassAuto.
func (t Tier) defaultClass() string {
	if t.DefaultClass != "" {
		return t.DefaultClass
	}
	return request.ClassDefault
}

// Grants lists the classes the tier grants, by rank.
func (t Tier) Grants() []string {
	granted := t.classes()
	var out []string
	for _, name := range request.Classes() {
		if _, ok := granted[name]; ok {
			out = append(out, name)
		}
	}
	return out
}

// Class resolves the service_tier a client asked for ("" or
// request.ClassAuto: the tier's default class) to the class the request
// is served in; false when the tier does not grant it (or it is no
// class).
func (t Tier) Class(asked string) (Class, bool) {
	name := asked
	if name == "" || name == request.ClassAuto {
		name = t.defaultClass()
	}
	limits, ok := t.classes()[name]
	rank, isClass := request.ClassRank(name)
	if !ok || !isClass {
		return Class{}, false
	}
	return Class{Name: name, Rank: rank, Weight: limits.Weight, TTFTSLO: limits.TTFTSLO, TPOTSLO: limits.TPOTSLO,
		RefuseLate: limits.RefuseLate && limits.TTFTSLO > 0}, true
}

// validateClasses checks the tier's classes at path field.
func (t Tier) validateClasses(field string, report Report) {
	// In name order, so that problems are reported in a stable order.
	for _, name := range slices.Sorted(maps.Keys(t.Classes)) {
		c := t.Classes[name]
		at := field + ".classes." + name
		if !request.IsClass(name) {
			report(at, "unknown class (want one of %s)", classList())
			continue
		}
		if c.Weight <= 0 {
			report(at+".weight", "must be > 0, got %d", c.Weight)
		}
		if c.TTFTSLO < 0 {
			report(at+".ttft_slo", "must be >= 0 (0 = none), got %s", c.TTFTSLO)
		}
		if c.TPOTSLO < 0 {
			report(at+".tpot_slo", "must be >= 0 (0 = none), got %s", c.TPOTSLO)
		}
		if c.RefuseLate && c.TTFTSLO <= 0 {
			report(at+".refuse_late", "needs a ttft_slo: it refuses requests that cannot get a permit within it")
		}
	}
	switch d := t.defaultClass(); {
	case !request.IsClass(d):
		report(field+".default_class", "unknown class %q (want one of %s)", d, classList())
	case len(t.Classes) == 0 && d != request.ClassDefault:
		report(field+".default_class", "names class %q, but the tier configures no classes (it grants only %s)", d, request.ClassDefault)
	case len(t.Classes) > 0:
		if _, ok := t.Classes[d]; !ok {
			report(field+".default_class", "names class %q, which %s.classes does not grant", d, field)
		}
	}
}

func classList() string { return strings.Join(request.Classes(), ", ") }
