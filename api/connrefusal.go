package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
)

// connRefusal is the answer to a connection beyond a cap: the whole HTTP
// response, rendered once, since it never changes.
type connRefusal struct {
	// limit is the setting that refused, as logs and metrics name it.
	limit    string
	response []byte
}

// The refusals: too many connections from one address is the client's to
// mend (429); too many in all is the server's (503), and so is a proxy's
// share full, which the clients behind it cannot mend either. Each may
// retry after a second, when connections have ended.
var (
	overPerIP    = newConnRefusal("api.max_conns_per_ip", refusal.Limited, request.ReasonTooManyConnections)
	overPerProxy = newConnRefusal("api.proxy_conns_share", refusal.Unavailable, request.ReasonConnectionsFull)
	overTotal    = newConnRefusal("api.max_conns", refusal.Unavailable, request.ReasonConnectionsFull)
)

// newConnRefusal renders the refusal as the API's error handler would
// (pkg/refusal's body, its Retry-After), closing the connection.
func newConnRefusal(limit string, class refusal.Class, reason string) connRefusal {
	e := refusal.Refused(class, request.Refused(reason, time.Second))
	status := httpio.Status(class)
	body, err := json.Marshal(map[string]*refusal.Error{"error": e})
	if err != nil {
		panic(fmt.Sprintf("render the %s refusal: %v", limit, err))
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", status, http.StatusText(status))
	fmt.Fprintf(&b, "Content-Type: application/json\r\nRetry-After: %d\r\nConnection: close\r\nContent-Length: %d\r\n\r\n", e.RetryAfter, len(body)+1)
	b.Write(body)
	b.WriteByte('\n')
	return connRefusal{limit: limit, response: b.Bytes()}
}

// refusalTimeout bounds everything a refused connection gets: reading
// its request's head, the answer, and waiting for the client to close.
const refusalTimeout = 2 * time.Second

// maxRefusedHead is as much of a refused request as is read before it is
// answered; maxRefusedDrain as much as is read after.
const (
	maxRefusedHead  = 8 << 10
	maxRefusedDrain = 1 << 20
)

// answerRefused answers a refused connection with response and closes
// it, reporting whether the answer was written. It first reads the
// request's head: an HTTP client expects its answer after its request,
// and a connection closed with its request unread is reset, which can
// destroy the answer before the client reads it. For the same reason it
// then shuts its side and reads until the client closes (or the
// deadline). A client that sends nothing is not answered.
func answerRefused(c net.Conn, response []byte) bool {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refusalTimeout))
	if !readHead(c) {
		return false
	}
	if _, err := c.Write(response); err != nil {
		return false
	}
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, maxRefusedDrain))
	return true
}

// readHead reads up to the end of a request's head (the blank line), at
// most maxRefusedHead bytes, keeping none of it: refusals may be many at
// once, so each holds a small buffer only. It reports whether anything
// came; a head cut short by the limit, the deadline or the client is
// answered all the same.
func readHead(c net.Conn) bool {
	var buf [512]byte
	// tail is the end of what came so far, so that a blank line split
	// between two reads is found.
	tail, n := make([]byte, 0, 3+len(buf)), 0
	for n < maxRefusedHead {
		m, err := c.Read(buf[:])
		n += m
		tail = append(tail, buf[:m]...)
		if bytes.Contains(tail, []byte("\r\n\r\n")) || err != nil {
			break
		}
		tail = append(tail[:0], tail[max(0, len(tail)-3):]...)
	}
	return n > 0
}
