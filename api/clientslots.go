package api

import (
	"net/netip"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/pkg/iphash"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
)

// clientSlots holds each client that a trusted proxy names to
// api.max_conns_per_ip requests at once. A client that connects itself
// is held to that many connections, and so requests (HTTP/1.1 carries
// one at a time); behind a proxy its requests share the proxy's
// connections, which the connection cap cannot tell apart, so the same
// cap is counted here, per request, by the forwarded address.
type clientSlots struct {
	max  int
	mu   sync.Mutex
	held map[netip.Addr]int
}

func newClientSlots(max int) *clientSlots {
	return &clientSlots{max: max, held: map[netip.Addr]int{}}
}

// take holds a slot of ip, or says it has none left.
func (c *clientSlots) take(ip netip.Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[ip] >= c.max {
		return false
	}
	c.held[ip]++
	return true
}

func (c *clientSlots) give(ip netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held[ip]--; c.held[ip] <= 0 {
		delete(c.held, ip)
	}
}

// holdForwardedClient holds a request that came through a trusted proxy
// to a slot of its client (an IPv6 client by its /64) for as long as its
// handler runs, a stream included; one beyond the cap is answered as a
// connection beyond it would be: 429 too_many_connections, Retry-After 1.
func (s *Server) holdForwardedClient(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !s.proxies.relayed(c.Request()) {
			return next(c)
		}
		ip, err := netip.ParseAddr(c.RealIP())
		if err != nil {
			return next(c)
		}
		ip = iphash.Client(ip)
		if !s.clientSlots.take(ip) {
			s.metrics.ConnectionRefused("api.max_conns_per_ip", true)
			return refusal.Refused(refusal.Limited, request.Refused(request.ReasonTooManyConnections, time.Second))
		}
		defer s.clientSlots.give(ip)
		return next(c)
	}
}
