package api

import (
	"net"
	"net/http"
	"net/netip"

	"github.com/labstack/echo/v4"
)

// proxies are the hops trusted to name their client (api.trusted_proxies).
// They decide, and only here: which address a request counts as (echo's
// RealIP, and through it every limit, ban and log line), and which
// connections carry many clients, and so are held to a proxy's share of
// the connections rather than the per-address cap, with their clients
// held per request instead (clientSlots) and never exempt from bans.
type proxies []netip.Prefix

// trusts says whether a connection or hop from ip is a trusted proxy.
func (p proxies) trusts(ip netip.Addr) bool {
	ip = ip.Unmap()
	for _, n := range p {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

// relayed says whether r came over a connection from a trusted proxy.
func (p proxies) relayed(r *http.Request) bool {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	return err == nil && p.trusts(ap.Addr())
}

// extractor is the RealIP of a request. With no trusted proxies it is the
// connection's address. Otherwise it is echo's X-Forwarded-For walk: from
// the connection's address leftwards through the header, the first hop
// that is not a trusted proxy; every entry left of it was written by
// someone who may lie, and an entry that does not parse ends the walk at
// the connection's address. Echo's own trust of loopback, link-local and
// private networks is switched off: only the configured networks are
// proxies, so a client on an internal network cannot name someone else.
func (p proxies) extractor() echo.IPExtractor {
	if len(p) == 0 {
		return echo.ExtractIPDirect()
	}
	opts := []echo.TrustOption{echo.TrustLoopback(false), echo.TrustLinkLocal(false), echo.TrustPrivateNet(false)}
	for _, n := range p {
		opts = append(opts, echo.TrustIPRange(&net.IPNet{IP: n.Addr().AsSlice(), Mask: net.CIDRMask(n.Bits(), n.Addr().BitLen())}))
	}
	return echo.ExtractIPFromXFFHeader(opts...)
}
