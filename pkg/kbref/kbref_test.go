package kbref

import "testing"

func TestKeyRoundTrips(t *testing.T) {
	for _, r := range []Ref{Shared("sluice-docs"), Own("acme", "docs"), Own("a/b", "c"), Own("x:y{z}", "d.e_f-1")} {
		got, err := ParseKey(r.Key())
		if err != nil || got != r {
			t.Errorf("ParseKey(%q) = %+v, %v; want %+v", r.Key(), got, err, r)
		}
	}
}

// A tenant's kb can never take a shared kb's key, nor another tenant's.
func TestKeysAreDistinct(t *testing.T) {
	keys := map[string]Ref{}
	for _, r := range []Ref{Shared("docs"), Own("acme", "docs"), Own("globex", "docs"), Own("acme", "docs2"), Own("acme/docs", "x"), Own("acme", "x")} {
		if other, dup := keys[r.Key()]; dup {
			t.Fatalf("%+v and %+v share key %q", r, other, r.Key())
		}
		keys[r.Key()] = r
	}
}

func TestParseKeyRefusesNonKeys(t *testing.T) {
	for _, k := range []string{"", "/docs", "acme/", "acme/bad name", "bad name", "acme/a/"} {
		if r, err := ParseKey(k); err == nil {
			t.Errorf("ParseKey(%q) = %+v, want an error", k, r)
		}
	}
}
