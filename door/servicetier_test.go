package door_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
)

// withClasses gives acme's metered tier the priority and flex classes
// beside default, each weighed differently from the tier.
func withClasses(c *config.Config) {
	t := meteredTier()
	t.Classes = map[string]policy.ClassLimits{
		request.ClassPriority: {Weight: 9, TTFTSLO: 700 * time.Millisecond, TPOTSLO: 40 * time.Millisecond},
		request.ClassDefault:  {Weight: 3},
		request.ClassFlex:     {Weight: 1},
	}
	c.Limits.Tiers["metered"] = t
}

// classRequest is a validated request asking for service tier class.
func (s *stack) classRequest(class string) *door.Request {
	s.t.Helper()
	n := 16
	req := &door.Request{Query: "What is a permit?", MaxTokens: &n, ServiceTier: class}
	if err := s.door.Validate(req); err != nil {
		s.t.Fatalf("validate: %v", err)
	}
	return req
}

// A request admitted at once starts in the class it asked for, with the
// class's weight and SLOs in place of its tier's, and its accepted event
// says the class.
func TestAdmissionWeighsTheRequestByItsClass(t *testing.T) {
	s := newStack(t, withClasses)
	adm := s.admit(acme, s.classRequest(request.ClassPriority))
	in := s.temporal.only(t).in
	if in.ServiceTier != request.ClassPriority || in.Settings.Weight != 9 || in.Settings.TTFTSLO != 700*time.Millisecond ||
		in.Settings.TPOTSLO != 40*time.Millisecond {
		t.Fatalf("class %q settings %+v: want priority at weight 9 with its SLOs", in.ServiceTier, in.Settings)
	}
	first := firstEvent(t, adm.Sub)
	var acc events.Accepted
	if err := json.Unmarshal(first.Data, &acc); err != nil || first.Type != events.TypeAccepted || acc.ServiceTier != request.ClassPriority {
		t.Fatalf("first event %s %s, want accepted in class priority", first.Type, first.Data)
	}
}

// A request that waits at the door holds its place in the fair order at
// its class's weight, and its workflow queues there.
func TestDoorPlaceIsWeighedByTheClass(t *testing.T) {
	s := newStack(t, func(c *config.Config) { onePermit(c); withClasses(c) })
	adm, held := s.waitAtDoor(context.Background(), s.classRequest(request.ClassFlex))
	s.release(held...)
	eventually(t, "the start", func() bool { return len(s.temporal.inputs()) == 1 })
	in := s.temporal.only(t).in
	if in.RequestID != adm.ID || in.AdmissionPlace.Tag == 0 || in.AdmissionPlace.Weight != 1 || in.Settings.Weight != 1 {
		t.Fatalf("place %+v, weight %d: want flex's weight 1 for both", in.AdmissionPlace, in.Settings.Weight)
	}
}

// A class the caller's plan does not grant is refused before anything
// is charged or started, naming service_tier; a plan without classes
// serves none but default.
func TestClassNotGrantedIsRefused(t *testing.T) {
	s := newStack(t, nil)
	_, err := s.door.Admit(context.Background(), acme, s.classRequest(request.ClassPriority))
	var re *refusal.Error
	if !errors.As(err, &re) || re.Class != refusal.Invalid || re.Code != "service_tier_not_allowed" || re.Param != door.ParamServiceTier {
		t.Fatalf("refusal %v, want invalid service_tier_not_allowed on service_tier", err)
	}
	if n := len(s.temporal.inputs()); n != 0 || s.charged() != 0 {
		t.Fatalf("%d started, %.0f tokens charged by a refused class", n, s.charged())
	}
	adm := s.admit(acme, s.classRequest(request.ClassAuto))
	if in := s.temporal.only(t).in; in.RequestID != adm.ID || in.ServiceTier != request.ClassDefault || in.Settings.Weight != meteredTier().Weight {
		t.Fatalf("auto on a plan without classes: class %q weight %d", in.ServiceTier, in.Settings.Weight)
	}
}

// A value that is no class is refused by validation, naming the field.
func TestUnknownServiceTierIsInvalid(t *testing.T) {
	s := newStack(t, nil)
	n := 16
	err := s.door.Validate(&door.Request{Query: "q", MaxTokens: &n, ServiceTier: "scale"})
	var re *refusal.Error
	if !errors.As(err, &re) || re.Code != "invalid_service_tier" || re.Param != door.ParamServiceTier {
		t.Fatalf("validate scale: %v", err)
	}
}
