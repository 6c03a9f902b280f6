// Package keys is Sluice's API keys: who a key names (tenant, user, tier)
// and what it may do (its scopes).
package keys

import (
	"fmt"
	"slices"
	"strings"
)

// Scope is one kind of access a key grants.
type Scope string

// The scopes. A key without ScopeIngest can ask questions of a knowledge
// base but not change it; ScopeAdmin reaches /v1/admin.
const (
	ScopeChat   Scope = "chat"
	ScopeIngest Scope = "ingest"
	ScopeAdmin  Scope = "admin"
)

// AllScopes are every scope, in a stable order.
var AllScopes = []Scope{ScopeChat, ScopeIngest, ScopeAdmin}

// DefaultScopes are the scopes of a key that names none: it may change
// knowledge bases or reach the admin API only when it says so.
var DefaultScopes = Scopes{ScopeChat}

// Scopes is the set a key holds.
type Scopes []Scope

// Has reports whether s grants scope.
func (s Scopes) Has(scope Scope) bool { return slices.Contains(s, scope) }

// String is the scopes comma-separated, as configured.
func (s Scopes) String() string {
	parts := make([]string, len(s))
	for i, sc := range s {
		parts[i] = string(sc)
	}
	return strings.Join(parts, ",")
}

// GrantedScopes reads the scopes a key names, DefaultScopes if none.
func GrantedScopes(names []string) (Scopes, error) {
	if len(names) == 0 {
		return DefaultScopes, nil
	}
	return ParseScopes(names)
}

// ParseScopes reads scope names, refusing unknown ones and repeats.
func ParseScopes(names []string) (Scopes, error) {
	out := make(Scopes, 0, len(names))
	for _, n := range names {
		sc := Scope(strings.TrimSpace(n))
		if !slices.Contains(AllScopes, sc) {
			return nil, fmt.Errorf("unknown scope %q (want one of %s)", n, Scopes(AllScopes))
		}
		if out.Has(sc) {
			return nil, fmt.Errorf("scope %q given twice", sc)
		}
		out = append(out, sc)
	}
	return out, nil
}
