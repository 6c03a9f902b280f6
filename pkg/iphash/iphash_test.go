package iphash

import (
	"net/netip"
	"strings"
	"testing"
)

func TestHashIsKeyedAndStable(t *testing.T) {
	a, b := New([]byte("key-a-0123456789")), New([]byte("key-b-0123456789"))
	ip := "203.0.113.7"
	if again := New([]byte("key-a-0123456789")); a.Of(ip) != again.Of(ip) {
		t.Fatal("one key hashes one address two ways")
	}
	if a.Of(ip) == b.Of(ip) {
		t.Fatal("two keys hash an address alike: the hash is not keyed")
	}
	if a.Of(ip) == a.Of("203.0.113.8") {
		t.Fatal("two addresses share a hash")
	}
	if h := a.Of(ip); len(h) != Len || !IsHash(h) || strings.Contains(h, "203") {
		t.Fatalf("hash %q", h)
	}
}

// HMAC-SHA-256 of "203.0.113.7" under "key-a-0123456789", by
// `printf %s 203.0.113.7 | openssl dgst -sha256 -hmac key-a-0123456789`,
// first 16 hex digits: the hash is the documented one, not another.
func TestHashIsHMACSHA256(t *testing.T) {
	if got := New([]byte("key-a-0123456789")).Of("203.0.113.7"); got != "0efa4dbf5556a8f1" {
		t.Fatalf("hash %s", got)
	}
}

func TestOneClientOneName(t *testing.T) {
	h := New([]byte("key-a-0123456789"))
	if h.Of("::ffff:192.0.2.1") != h.Of("192.0.2.1") || h.Addr(netip.MustParseAddr("::ffff:192.0.2.1")) != h.Of("192.0.2.1") {
		t.Fatal("an IPv4-mapped address is named apart from its IPv4 address")
	}
	if h.Of("2001:DB8::1") != h.Of("2001:db8::1") {
		t.Fatal("one IPv6 address in two spellings has two names")
	}
	if h.Of("not an address") == "" || h.Of("not an address") == h.Of("") {
		t.Fatal("text that is no address must still be hashed")
	}
}

func TestNilHasherUsesTheDevKey(t *testing.T) {
	var h *Hasher
	if !h.UsesDevKey() || !New(nil).UsesDevKey() || New([]byte("k")).UsesDevKey() {
		t.Fatal("UsesDevKey")
	}
	if h.Of("192.0.2.1") != New(devKey).Of("192.0.2.1") {
		t.Fatal("a nil Hasher does not hash with the development key")
	}
}

func TestIsHash(t *testing.T) {
	for s, want := range map[string]bool{"0123456789abcdef": true, "0123456789ABCDEF": false, "0123456789abcde": false,
		"192.0.2.1": false, "2001:db8::1": false, "0123456789abcdeg": false} {
		if IsHash(s) != want {
			t.Errorf("IsHash(%q) = %t", s, !want)
		}
	}
}

// A client is counted by its IPv4 address, or by its IPv6 /64: the
// addresses of one /64 are one client, another /64 is another.
func TestClientCountsIPv6ByItsSlash64(t *testing.T) {
	h := New([]byte("k"))
	same := []string{"2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::"}
	for _, a := range same[1:] {
		if h.ClientOf(a) != h.ClientOf(same[0]) {
			t.Errorf("%s and %s are one /64 but two clients", a, same[0])
		}
	}
	if h.ClientOf("2001:db8:1:3::1") == h.ClientOf(same[0]) {
		t.Error("two /64s are one client")
	}
	if h.ClientOf("::ffff:192.0.2.1") != h.ClientOf("192.0.2.1") || h.ClientOf("192.0.2.1") == h.ClientOf("192.0.2.2") {
		t.Error("IPv4 clients are not counted by their address")
	}
	if got := Client(netip.MustParseAddr("2001:db8:1:2:3:4:5:6")); got != netip.MustParseAddr("2001:db8:1:2::") {
		t.Errorf("Client = %s", got)
	}
}
