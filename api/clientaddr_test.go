package api

import (
	"net/http/httptest"
	"net/netip"
	"testing"
)

// The client of a request is the address left of the last trusted hop,
// read from the connection's address leftwards through X-Forwarded-For:
// what a client writes into the header itself is never believed, and
// without trusted proxies the header is ignored.
func TestClientAddressFromTrustedProxies(t *testing.T) {
	trusted := proxies{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	cases := []struct {
		name, remote string
		xff          []string
		proxies      proxies
		want         string
	}{
		{"no proxies: the connection", "203.0.113.7:5000", []string{"198.51.100.1"}, nil, "203.0.113.7"},
		{"untrusted connection: its own address", "203.0.113.7:5000", []string{"198.51.100.1"}, trusted, "203.0.113.7"},
		{"one trusted hop", "10.1.2.3:5000", []string{"198.51.100.1"}, trusted, "198.51.100.1"},
		{"a forged entry left of the client", "10.1.2.3:5000", []string{"127.0.0.1, 198.51.100.1"}, trusted, "198.51.100.1"},
		{"a forged entry naming a proxy", "10.1.2.3:5000", []string{"10.9.9.9, 198.51.100.1"}, trusted, "198.51.100.1"},
		{"two trusted hops", "10.1.2.3:5000", []string{"198.51.100.1, 10.4.4.4"}, trusted, "198.51.100.1"},
		{"a header per hop", "10.1.2.3:5000", []string{"192.0.2.9", "198.51.100.1"}, trusted, "198.51.100.1"},
		{"loopback is not trusted unless listed", "127.0.0.1:5000", []string{"198.51.100.1"}, trusted, "127.0.0.1"},
		{"private networks are not trusted unless listed", "192.168.1.1:5000", []string{"198.51.100.1"}, trusted, "192.168.1.1"},
		{"no header: the proxy itself", "10.1.2.3:5000", nil, trusted, "10.1.2.3"},
		{"IPv6 behind a trusted IPv6 proxy", "[fd00::1]:5000", []string{"2001:db8::5"}, trusted, "2001:db8::5"},
		{"garbage from a trusted hop: the connection", "10.1.2.3:5000", []string{"nonsense"}, trusted, "10.1.2.3"},
	}
	for _, c := range cases {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.remote
		for _, h := range c.xff {
			r.Header.Add("X-Forwarded-For", h)
		}
		if got := c.proxies.extractor()(r); got != c.want {
			t.Errorf("%s: client %q, want %q", c.name, got, c.want)
		}
	}
}

// trusts matches an IPv4 proxy however its socket reports it.
func TestProxiesTrustMappedAddresses(t *testing.T) {
	p := proxies{netip.MustParsePrefix("10.0.0.0/8")}
	if !p.trusts(netip.MustParseAddr("::ffff:10.1.2.3")) || p.trusts(netip.MustParseAddr("11.0.0.1")) || (proxies{}).trusts(netip.MustParseAddr("10.0.0.1")) {
		t.Fatal("trusts: wrong verdict")
	}
}
