package api

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"

	"github.com/sluice-dev/sluice/pkg/iphash"
	"github.com/sluice-dev/sluice/pkg/logsample"
)

// connLimiter is a listener that caps open connections, in total and per
// client address. A connection beyond either cap is closed as soon as it
// is accepted, before a byte of it is read: it costs no goroutine and no
// header timeout, so a flood from one address cannot use up the total.
// The client sees the connection closed (or reset) and should retry with
// backoff. netutil.LimitListener is not used for the total because it
// makes Accept wait instead of refusing: every client, hostile or not,
// would then hang in the kernel's backlog.
//
// The address is the connection's remote IP, never X-Forwarded-For, which
// a client can write as it likes.
type connLimiter struct {
	net.Listener
	total, perIP int
	logger       *slog.Logger
	// addresses names the refused client in the log by its hash (nil:
	// the development key).
	addresses *iphash.Hasher

	mu   sync.Mutex
	open int
	byIP map[netip.Addr]int
	// refusals samples the log lines about refused connections.
	refusals *logsample.Sampler
}

func limitConns(ln net.Listener, total, perIP int, logger *slog.Logger) *connLimiter {
	return &connLimiter{Listener: ln, total: total, perIP: perIP, logger: logger, byIP: map[netip.Addr]int{}, refusals: logsample.New()}
}

// Accept returns the next connection within the caps, closing those
// beyond them.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := remoteIP(c)
		if why := l.admit(ip); why != "" {
			_ = c.Close()
			l.noteRefusal(ip, why)
			continue
		}
		return &limitedConn{Conn: c, release: func() { l.release(ip) }}, nil
	}
}

// admit counts a new connection from ip, or says which cap it is beyond.
func (l *connLimiter) admit(ip netip.Addr) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.open >= l.total:
		return "api.max_conns"
	case l.byIP[ip] >= l.perIP:
		return "api.max_conns_per_ip"
	}
	l.open++
	l.byIP[ip]++
	return ""
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

func (l *connLimiter) noteRefusal(ip netip.Addr, limit string) {
	if skipped, ok := l.refusals.Allow(""); ok {
		l.logger.Warn("refusing connections over a cap", "limit", limit, "lastIPHash", l.addresses.Addr(ip), "refused", skipped+1)
	}
}

// remoteIP is the client a connection counts as (iphash.Client: an IPv6
// client by its /64, as limits and bans count it); an unknown one (not
// TCP) is the zero address, shared by all such connections.
func remoteIP(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return iphash.Client(a.AddrPort().Addr())
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
