// Package iphash names client addresses by a keyed hash wherever they
// would otherwise be written down: Redis key names (rate-limit buckets,
// bans), the ban list, logs. The address itself is never stored.
//
// A plain hash would not do: there are only 2^32 IPv4 addresses, and
// hashing every one of them takes minutes, so SHA-256(ip) is reversed by
// enumeration. HMAC-SHA-256 under a secret key (privacy.ip_hash_key) cannot
// be enumerated without the key.
package iphash

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
)

// Len is the length of a hash in hex digits: 64 bits, so that two of the
// 2^32 IPv4 addresses share a name with odds of about one half, and two
// of the few thousand clients a deployment sees, practically never.
const Len = 16

// devKey is the key of a Hasher built without one. It is public (it is in
// the source), so its hashes can be enumerated like plain ones: it keeps
// development stacks working, and a process built with it says so at start.
var devKey = []byte("sluice development key: set privacy.ip_hash_key")

// Hasher hashes addresses under one key. Every process of a deployment
// must use the same key, or each would count a client apart. A nil
// *Hasher hashes with the public development key.
type Hasher struct{ key []byte }

// New returns a Hasher keyed with key; an empty key means the public
// development key.
func New(key []byte) *Hasher {
	if len(key) == 0 {
		return nil
	}
	return &Hasher{key: append([]byte(nil), key...)}
}

// UsesDevKey reports whether h hashes with the public development key.
func (h *Hasher) UsesDevKey() bool { return h == nil }

// Addr is the hash of ip. An IPv4-mapped IPv6 address is its IPv4
// address, so that one client has one name however its socket reports it.
func (h *Hasher) Addr(ip netip.Addr) string {
	return h.sum(ip.Unmap().String())
}

// Of is the hash of an address given as text, as echo's RealIP returns
// it; text that is not an address is hashed as it is (it still must not
// be written down as it came).
func (h *Hasher) Of(addr string) string {
	if ip, err := netip.ParseAddr(addr); err == nil {
		return h.Addr(ip)
	}
	return h.sum(addr)
}

func (h *Hasher) sum(s string) string {
	key := devKey
	if h != nil {
		key = h.key
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(s))
	return hex.EncodeToString(m.Sum(nil))[:Len]
}

// IsHash reports whether s has the form of a hash: Len lower-case hex
// digits. No address has that form (an IPv6 address has colons), so an
// operator may name a client by either.
func IsHash(s string) bool {
	if len(s) != Len {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Client is the address a client is counted by, in limits, bans and
// connection caps alike: an IPv4 address as it is, an IPv6 one by its /64
// (what one host is usually given), so that a client cannot escape a
// limit by rotating through the addresses of its own /64.
func Client(ip netip.Addr) netip.Addr {
	if ip = ip.Unmap(); ip.Is6() {
		return netip.PrefixFrom(ip, 64).Masked().Addr()
	}
	return ip
}

// ClientOf is the hash of the client an address given as text counts as
// (Client); text that is not an address is hashed as it is.
func (h *Hasher) ClientOf(addr string) string {
	if ip, err := netip.ParseAddr(addr); err == nil {
		return h.Addr(Client(ip))
	}
	return h.sum(addr)
}
