// Package kbref names knowledge bases. A kb belongs to a tenant, whose
// own namespace it lives in (two tenants may each have a kb "docs"), or
// is shared: declared by the operator, readable by every tenant. A
// client names a kb by its name alone; the door resolves the name to a
// Ref once, and every store and cache below knows the kb by the Ref's
// Key, so that one tenant's kb is never another's.
package kbref

import (
	"fmt"
	"strings"
)

// Ref is a resolved kb: its owner and its name.
type Ref struct {
	// Tenant owns the kb; "" for a shared kb.
	Tenant string
	Name   string
}

// Shared is the shared kb of that name.
func Shared(name string) Ref { return Ref{Name: name} }

// Own is tenant's own kb of that name.
func Own(tenant, name string) Ref { return Ref{Tenant: tenant, Name: name} }

// IsShared reports whether the kb is shared rather than a tenant's own.
func (r Ref) IsShared() bool { return r.Tenant == "" }

// sep joins owner and name in a Key. No valid name holds it, so a
// tenant's key never equals a shared kb's, and the last one splits a key
// back whatever the tenant's name holds.
const sep = "/"

// Key is the kb's identity in storage: the name alone for a shared kb —
// so shared kbs keep the keys every kb had before kbs had owners — and
// "<tenant>/<name>" for a tenant's own.
func (r Ref) Key() string {
	if r.IsShared() {
		return r.Name
	}
	return r.Tenant + sep + r.Name
}

// String is the Key, for logs.
func (r Ref) String() string { return r.Key() }

// ParseKey is Key's inverse.
func ParseKey(key string) (Ref, error) {
	i := strings.LastIndex(key, sep)
	if i < 0 {
		if !ValidName(key) {
			return Ref{}, fmt.Errorf("kb key %q: not a valid name", key)
		}
		return Shared(key), nil
	}
	r := Own(key[:i], key[i+1:])
	if r.Tenant == "" || !ValidName(r.Name) {
		return Ref{}, fmt.Errorf("kb key %q: want <tenant>/<name>", key)
	}
	return r, nil
}

// ValidName reports whether name may name a kb: 1–64 of letters, digits,
// '-', '_' and '.'.
func ValidName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// NameRule says what ValidName accepts, for error messages.
const NameRule = "1-64 letters, digits, '-', '_' or '.'"
