package door

import (
	"context"
	"slices"
	"sync"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// KBs is what a caller's kb names mean: the configured (shared) kbs and
// the tenants' own, in the kb store.
type KBs struct {
	// configured are the configured kbs, by key (kbref.Ref.Key).
	configured map[string]bool
	shared     []string
	store      *kbstore.Store
	// seen are kb keys known to exist (see Known).
	seen sync.Map
}

func newKBs(kbs []config.KnowledgeBase, store *kbstore.Store) *KBs {
	k := &KBs{configured: map[string]bool{}, store: store}
	for _, kb := range kbs {
		k.configured[kbref.Ref{Tenant: kb.Tenant, Name: kb.Name}.Key()] = true
		if kb.Shared {
			k.shared = append(k.shared, kb.Name)
		}
	}
	slices.Sort(k.shared)
	return k
}

// IsShared reports whether the operator declared name shared. A bare name
// is the key of a shared kb only.
func (k *KBs) IsShared(name string) bool { return k.configured[kbref.Shared(name).Key()] }

// Shared are the shared kbs' names, sorted.
func (k *KBs) Shared() []string { return slices.Clone(k.shared) }

// Resolve is the kb a caller means by name: the shared kb of that name if
// there is one, else its tenant's own. So a name means one kb to a tenant
// whatever other tenants call theirs, and another tenant's kb cannot be
// named at all.
func (k *KBs) Resolve(who Caller, name string) kbref.Ref {
	if k.IsShared(name) {
		return kbref.Shared(name)
	}
	return kbref.Own(who.Tenant, name)
}

// Readable are the names of the kbs who may ask, sorted: the shared ones
// and its tenant's own (none in a process without a kb store).
func (k *KBs) Readable(ctx context.Context, who Caller) ([]string, error) {
	if k.store == nil {
		return k.Shared(), nil
	}
	own, err := k.store.KBs(ctx, who.Tenant)
	if err != nil {
		return nil, err
	}
	names := k.Shared()
	for _, name := range own {
		// A tenant's kb whose name the operator since declared shared
		// is out of its reach.
		if !k.IsShared(name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// CheckName refuses a kb name that cannot name a kb.
func CheckName(kb string) error {
	if !kbref.ValidName(kb) {
		return refusal.BadRequest("bad_kb", "knowledge base names are %s", kbref.NameRule)
	}
	return nil
}

// Writable is the kb a write names, if the caller may change it: its key
// holds the ingest scope and the kb is its tenant's own. A shared kb is
// anyone's to read, so refusing a write to it (403) reveals nothing;
// another tenant's kb cannot be named (the name is the caller's own kb).
func (k *KBs) Writable(who Caller, name string) (kbref.Ref, error) {
	if err := CheckName(name); err != nil {
		return kbref.Ref{}, err
	}
	if err := who.Needs(keys.ScopeIngest, "change knowledge bases"); err != nil {
		return kbref.Ref{}, err
	}
	kb := k.Resolve(who, name)
	if kb.IsShared() {
		return kbref.Ref{}, &refusal.Error{Class: refusal.Forbidden, Code: "kb_read_only",
			Message: "knowledge base " + name + " is shared: every tenant may read it, none may change it"}
	}
	return kb, nil
}

// Known reports whether a chat request may name kb. A kb, once written,
// is never removed (only its documents are), so a yes is remembered: a
// flood naming a real kb costs Redis nothing here.
func (k *KBs) Known(ctx context.Context, kb kbref.Ref) (bool, error) {
	key := kb.Key()
	if k.store == nil || k.configured[key] || kb.IsShared() {
		// A configured kb is known even while Redis lacks it (it
		// restarted empty): the workers seed it again. Every shared kb
		// is a configured one.
		return k.configured[key], nil
	}
	if _, ok := k.seen.Load(key); ok {
		return true, nil
	}
	if !kbref.ValidName(kb.Name) {
		return false, nil
	}
	v, err := k.store.Version(ctx, key)
	if v > 0 {
		k.seen.Store(key, struct{}{})
	}
	return v > 0, err
}

// resolveChatKB resolves a chat request's kb for its caller once, at the
// door, and records the owner in the request for its workflow input.
func (d *Door) resolveChatKB(who Caller, req *Request) kbref.Ref {
	kb := d.kbs.Resolve(who, req.KB)
	req.kbTenant = kb.Tenant
	return kb
}

// kbRef is the request's kb as the door resolved it.
func (req *Request) kbRef() kbref.Ref { return kbref.Ref{Tenant: req.kbTenant, Name: req.KB} }

// checkKB refuses a request for a knowledge base that does not exist.
func (d *Door) checkKB(ctx context.Context, kb kbref.Ref) error {
	known, err := d.kbs.Known(ctx, kb)
	switch {
	case err != nil:
		d.logger.Error("look up kb", "kb", kb, "err", err)
		return refusal.Unreachable("knowledge bases unavailable; please retry")
	case !known:
		return refusal.BadRequest("unknown_kb", "unknown knowledge base %q", kb.Name)
	}
	return nil
}
