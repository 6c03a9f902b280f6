package request

import "strings"

// Service classes a request is served in, as OpenAI's service_tier names
// them: a client asks for one on each request, its plan (the key's tier)
// decides which it may use, and the answer says which it got.
const (
	// ClassPriority is for interactive traffic: served first, and the
	// class whose first token the scheduler guards.
	ClassPriority = "priority"
	// ClassDefault is the class of a request that names none, on a plan
	// that configures no classes.
	ClassDefault = "default"
	// ClassFlex is for work that can wait: served when the others leave
	// room.
	ClassFlex = "flex"
	// ClassAuto asks for the plan's default class; it is never the class
	// a request is served in.
	ClassAuto = "auto"
)

// Classes lists the classes by rank, the most urgent first.
func Classes() []string { return []string{ClassPriority, ClassDefault, ClassFlex} }

// ClassRank is a class's rank, 0 for the most urgent, and whether name is
// a class at all.
func ClassRank(name string) (int, bool) {
	for i, c := range Classes() {
		if c == name {
			return i, true
		}
	}
	return 0, false
}

// IsClass reports whether name is a class a request can be served in.
func IsClass(name string) bool {
	_, ok := ClassRank(name)
	return ok
}

// IsServiceTier reports whether v is a value a client may send as
// service_tier: a class, ClassAuto, or "" (none: the plan's default).
func IsServiceTier(v string) bool { return v == "" || v == ClassAuto || IsClass(v) }

// ServiceTierValues are the values a client may send, for messages.
func ServiceTierValues() string { return ClassAuto + ", " + strings.Join(Classes(), ", ") }

// ServedClass is the class a request whose service tier is tier is
// served in, as the scheduler counts it: tier itself when it is a class,
// else ClassDefault (a request that names none, or one whose plan
// configures no classes).
func ServedClass(tier string) string {
	if IsClass(tier) {
		return tier
	}
	return ClassDefault
}

// PausesOthers reports whether a stream may be paused for a request of
// the class of rank: a class less urgent than its own exists (the least
// urgent pauses nothing).
func PausesOthers(rank int) bool { return rank < len(Classes())-1 }
