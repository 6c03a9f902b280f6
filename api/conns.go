package api

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/sluice-dev/sluice/pkg/iphash"
	"github.com/sluice-dev/sluice/pkg/logsample"
	"github.com/sluice-dev/sluice/pkg/metrics"
)

// connCaps are a connLimiter's caps and what it reports to.
type connCaps struct {
	// Total bounds the open connections (api.max_conns); PerIP those of
	// one client address (api.max_conns_per_ip); PerProxy those of one
	// trusted proxy (api.proxy_conns_share of Total) instead.
	Total, PerIP, PerProxy int
	Proxies                proxies
	// Addresses names the refused client in the log by its hash (nil:
	// the development key).
	Addresses *iphash.Hasher
	Metrics   *metrics.Metrics
	Logger    *slog.Logger
}

// connLimiter is a listener that caps open connections, in total and per
// client address. A connection beyond either cap never reaches the HTTP
// server: it costs no handler and no header timeout, so a flood from one
// address cannot use up the total. It is answered on the side with a
// fixed 429 or 503 and a Retry-After, the answer every other refusal
// gives, so that a client can tell a refusal from a broken network; while
// too many refusals are being answered already, it is closed unanswered.
// netutil.LimitListener is not used for the total because it makes
// Accept wait instead of refusing: every client, hostile or not, would
// then hang in the kernel's backlog.
//
// The address is the connection's remote IP, never X-Forwarded-For, which
// a client can write as it likes, and which is not read before the
// connection is taken. A trusted proxy's connections carry many clients,
// so they are held to a share of the total rather than the per-address
// cap: room for the clients behind it, and room left for the others. The
// clients behind it are held by the forwarded address per request
// (clientSlots), to the rate limits, the bans and the per-address cap.
type connLimiter struct {
	net.Listener
	caps connCaps

	mu   sync.Mutex
	open int
	byIP map[netip.Addr]int
	// refusals samples the log lines about refused connections.
	refusals *logsample.Sampler
	// answering counts the refused connections being answered now.
	answering atomic.Int64
}

func limitConns(ln net.Listener, caps connCaps) *connLimiter {
	if caps.Logger == nil {
		caps.Logger = slog.Default()
	}
	return &connLimiter{Listener: ln, caps: caps, byIP: map[netip.Addr]int{}, refusals: logsample.New()}
}

// Accept returns the next connection within the caps, refusing those
// beyond them.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		raw := remoteIP(c)
		ip := iphash.Client(raw)
		if r := l.admit(ip, l.caps.Proxies.trusts(raw)); r != nil {
			l.refuse(c, r)
			l.noteRefusal(ip, r.limit)
			continue
		}
		return &limitedConn{Conn: c, release: func() { l.release(ip) }}, nil
	}
}

// admit counts a new connection from ip, or says which cap it is beyond;
// a proxy's connection is held to the per-proxy cap, not the per-address
// one.
func (l *connLimiter) admit(ip netip.Addr, proxy bool) *connRefusal {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.open >= l.caps.Total:
		return &overTotal
	case proxy && l.byIP[ip] >= l.caps.PerProxy:
		return &overPerProxy
	case !proxy && l.byIP[ip] >= l.caps.PerIP:
		return &overPerIP
	}
	l.open++
	l.byIP[ip]++
	return nil
}

func (l *connLimiter) release(ip netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
}

// Open is the number of connections open now.
func (l *connLimiter) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// maxAnswering bounds the refused connections answered at once: each
// holds a goroutine, a socket and half a KiB for up to refusalTimeout
// (a well-behaved client closes once it has read the answer, at once),
// about 12 KiB in all, so that a burst of thousands is answered while a
// flood that holds its refusals open costs at most ~50 MiB.
const maxAnswering = 4096

// refuse answers c with r's response on a goroutine of its own, or closes
// it at once when maxAnswering are being answered, and counts it.
func (l *connLimiter) refuse(c net.Conn, r *connRefusal) {
	if l.answering.Add(1) > maxAnswering {
		l.answering.Add(-1)
		_ = c.Close()
		l.caps.Metrics.ConnectionRefused(r.limit, false)
		return
	}
	go func() {
		defer l.answering.Add(-1)
		l.caps.Metrics.ConnectionRefused(r.limit, answerRefused(c, r.response))
	}()
}

func (l *connLimiter) noteRefusal(ip netip.Addr, limit string) {
	if skipped, ok := l.refusals.Allow(""); ok {
		l.caps.Logger.Warn("refusing connections over a cap", "limit", limit, "lastIPHash", l.caps.Addresses.Addr(ip), "refused", skipped+1)
	}
}

// remoteIP is a connection's remote address; an unknown one (not TCP) is
// the zero address, shared by all such connections.
func remoteIP(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// limitedConn gives its place back when it closes, once however often it
// is closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
