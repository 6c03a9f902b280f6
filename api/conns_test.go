package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/workflows"
)

// serve runs a test server on a loopback port through Run, with the
// server's own timeouts and connection caps, and returns its address.
func serve(t *testing.T, mod func(*config.Config)) (*Server, *countingClient, string) {
	t.Helper()
	srv, tc, _ := newTestServer(t, func(c *config.Config) {
		c.API.Addr = "127.0.0.1:0"
		c.API.ShutdownTimeout = time.Second
		if mod != nil {
			mod(c)
		}
	})
	runHub(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	addrCh, done := make(chan string, 1), make(chan error, 1)
	go func() { done <- srv.Run(ctx, func(a string) { addrCh <- a }, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case addr := <-addrCh:
		return srv, tc, addr
	case err := <-done:
		t.Fatalf("run: %v", err)
	}
	return nil, nil, ""
}

// dialFrom connects to addr from the local IP from, with a small receive
// buffer so that a client that does not read is found out quickly.
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{
		LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)},
		Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
			})
			return errors.Join(err, serr)
		},
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, from, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip sends a request on c and reads its whole response.
func roundTrip(t *testing.T, c net.Conn, br *bufio.Reader, raw string) (*http.Response, string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatalf("write request: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, string(body)
}

const getHealthz = "GET /healthz HTTP/1.1\r\nHost: sluice\r\n\r\n"

// acceptedRequest writes the first event of a request of acme's, so that
// its stream can be read at /v1/requests/:id/events.
func acceptedRequest(t *testing.T, srv *Server) string {
	t.Helper()
	id := door.NewRequestID()
	if _, err := srv.events.Append(context.Background(), id, events.TypeAccepted, events.Accepted{RequestID: id, Tenant: "acme", User: "acme"}); err != nil {
		t.Fatal(err)
	}
	return id
}

func getEventsRequest(id string) string {
	return "GET /v1/requests/" + id + "/events HTTP/1.1\r\nHost: sluice\r\nAuthorization: Bearer k-acme\r\n\r\n"
}

// expectClosed reads what is left on c and requires the server to have
// closed it (EOF or reset), not merely to have gone quiet.
func expectClosed(t *testing.T, c net.Conn, within time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(within))
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection still open after %v", within)
	}
}

// A client that stops reading an event stream is dropped within the write
// deadline once its socket's buffers are full, and its request detached;
// the handler does not wait on it.
func TestSlowSSEReaderIsDroppedAndDetached(t *testing.T) {
	const writeTimeout = 300 * time.Millisecond
	srv, tc, addr := serve(t, func(c *config.Config) { c.API.StreamWriteTimeout = writeTimeout })
	id := acceptedRequest(t, srv)
	c := dialFrom(t, "127.0.0.1", addr)
	if _, err := io.WriteString(c, getEventsRequest(id)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stream attached", func() bool { return tc.sent(workflows.SignalAttach) })

	// Far more than the socket buffers of both ends hold, and never read.
	text := strings.Repeat("x", 64<<10)
	for i := 0; i < 10; i++ {
		batch := make([]events.Pending, 20)
		for j := range batch {
			batch[j] = events.Pending{Type: events.TypeToken, Data: events.Token{Text: text, Index: 20*i + j}}
		}
		if _, err := srv.events.AppendBatch(context.Background(), id, batch); err != nil {
			t.Fatal(err)
		}
	}
	written := time.Now()
	waitFor(t, "the slow reader detached", func() bool { return tc.sent(workflows.SignalDetach) })
	took := time.Since(written)
	t.Logf("detached %v after the last event was written", took)
	if took > 3*writeTimeout+2*time.Second {
		t.Errorf("detached %v after the events were written; the write deadline is %v", took, writeTimeout)
	}
	waitFor(t, "the connection closed", func() bool { return srv.conns.Open() == 0 })
	expectClosed(t, c, 5*time.Second)
}

// The deadline of a stream's last write does not carry over to the next
// request on the same keep-alive connection (net/http clears it once a
// response is finished; httpio.SSEWriter relies on that).
func TestWriteDeadlineEndsWithTheStream(t *testing.T) {
	const writeTimeout = 200 * time.Millisecond
	srv, _, addr := serve(t, func(c *config.Config) { c.API.StreamWriteTimeout = writeTimeout })
	id := acceptedRequest(t, srv)
	if _, err := srv.events.Append(context.Background(), id, events.TypeDone, events.Done{RequestID: id}); err != nil {
		t.Fatal(err)
	}
	c := dialFrom(t, "127.0.0.1", addr)
	br := bufio.NewReader(c)
	resp, body := roundTrip(t, c, br, getEventsRequest(id))
	if resp.StatusCode != 200 || !strings.Contains(body, "event: done") {
		t.Fatalf("stream: %d %q", resp.StatusCode, body)
	}
	time.Sleep(3 * writeTimeout)
	if resp, body := roundTrip(t, c, br, getHealthz); resp.StatusCode != 200 {
		t.Fatalf("next request on the connection: %d %s", resp.StatusCode, body)
	}
}

// A body that does not arrive within api.body_read_timeout of its headers
// is answered 408, and the connection is closed.
func TestSlowBodyIs408(t *testing.T) {
	_, tc, addr := serve(t, func(c *config.Config) { c.API.BodyReadTimeout = 300 * time.Millisecond })
	c := dialFrom(t, "127.0.0.1", addr)
	start := time.Now()
	resp, body := roundTrip(t, c, bufio.NewReader(c), "POST /v1/chat HTTP/1.1\r\nHost: sluice\r\nAuthorization: Bearer k-acme\r\n"+
		"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"query\":")
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(body, `"body_timeout"`) {
		t.Fatalf("slow body: %d %s", resp.StatusCode, body)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("refused after %v", took)
	}
	expectClosed(t, c, 3*time.Second)
	if tc.starts.Load() != 0 {
		t.Fatal("a workflow started")
	}
}

// A keep-alive connection that carries no request for api.idle_timeout is
// closed.
func TestIdleConnectionIsClosed(t *testing.T) {
	_, _, addr := serve(t, func(c *config.Config) { c.API.IdleTimeout = 300 * time.Millisecond })
	c := dialFrom(t, "127.0.0.1", addr)
	if resp, _ := roundTrip(t, c, bufio.NewReader(c), getHealthz); resp.StatusCode != 200 {
		t.Fatalf("healthz %d", resp.StatusCode)
	}
	expectClosed(t, c, 3*time.Second)
}

// Connections beyond api.max_conns_per_ip from one address, or beyond
// api.max_conns in all, are answered 429 or 503 with Retry-After and the
// API's error body, closed and counted; a place freed is usable again.
func TestConnectionCaps(t *testing.T) {
	srv, _, addr := serve(t, func(c *config.Config) { c.API.MaxConnsPerIP = 2; c.API.MaxConns = 3 })
	open := func(from string) net.Conn {
		c := dialFrom(t, from, addr)
		if resp, _ := roundTrip(t, c, bufio.NewReader(c), getHealthz); resp.StatusCode != 200 {
			t.Fatalf("healthz from %s: %d", from, resp.StatusCode)
		}
		return c
	}
	first := open("127.0.0.1")
	open("127.0.0.1")
	expectRefused(t, addr, "127.0.0.1", http.StatusTooManyRequests, "too_many_connections")
	// Another address has places of its own, up to the total.
	open("127.0.0.2")
	expectRefused(t, addr, "127.0.0.2", http.StatusServiceUnavailable, "connections_full")
	if n := srv.conns.Open(); n != 3 {
		t.Fatalf("%d connections counted open, want 3", n)
	}
	_ = first.Close()
	waitFor(t, "the closed connection's place freed", func() bool { return srv.conns.Open() == 2 })
	open("127.0.0.1")
	// A refusal is counted once its connection is done with.
	for _, want := range []string{
		`sluice_api_connections_refused_total{answered="true",limit="api.max_conns_per_ip"} 1`,
		`sluice_api_connections_refused_total{answered="true",limit="api.max_conns"} 1`,
	} {
		waitFor(t, want, func() bool { return strings.Contains(metricsText(t, srv), want) })
	}
}

// A connection from a trusted proxy carries many clients: it is held to
// api.proxy_conns_share of api.max_conns, not to the per-address cap, so
// one trusted peer opening connections cannot take every place: the next
// client from another address is served. Any other address is still held
// to the per-address cap.
func TestOneTrustedProxyCannotTakeEveryConnection(t *testing.T) {
	const total = 6
	_, _, addr := serve(t, func(c *config.Config) {
		c.API.MaxConnsPerIP, c.API.MaxConns, c.API.ProxyConnsShare = 1, total, 0.5
		c.API.TrustedProxies = []string{"127.0.0.1/32"}
	})
	held := 0
	for held < total {
		c := dialFrom(t, "127.0.0.1", addr)
		resp, _ := roundTrip(t, c, bufio.NewReader(c), getHealthz)
		if resp.StatusCode != 200 {
			break
		}
		held++
	}
	if held != total/2 {
		t.Errorf("one trusted proxy holds %d connections of %d, want its share %d", held, total, total/2)
	}
	expectRefused(t, addr, "127.0.0.1", http.StatusServiceUnavailable, "connections_full")
	for _, from := range []string{"127.0.0.2", "127.0.0.3"} {
		c := dialFrom(t, from, addr)
		if resp, body := roundTrip(t, c, bufio.NewReader(c), getHealthz); resp.StatusCode != 200 {
			t.Fatalf("healthz from %s beside the proxy's %d connections: %d %s", from, held, resp.StatusCode, body)
		}
	}
	expectRefused(t, addr, "127.0.0.2", http.StatusTooManyRequests, "too_many_connections")
}

// A client behind a trusted proxy is held to api.max_conns_per_ip
// requests at once by the address the proxy names: its requests share
// the proxy's connections, so its own stream holds its one place, and
// another client of the same proxy is not concerned.
func TestForwardedClientIsHeldToThePerAddressCap(t *testing.T) {
	srv, tc, addr := serve(t, func(c *config.Config) {
		c.API.MaxConnsPerIP, c.API.MaxConns = 1, 16
		c.API.TrustedProxies = []string{"127.0.0.1/32"}
	})
	id := acceptedRequest(t, srv)
	stream := dialFrom(t, "127.0.0.1", addr)
	if _, err := io.WriteString(stream, strings.Replace(getEventsRequest(id), "\r\n\r\n", "\r\nX-Forwarded-For: 198.51.100.7\r\n\r\n", 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stream attached", func() bool { return tc.sent(workflows.SignalAttach) })
	forwarded := func(client string) (*http.Response, string) {
		c := dialFrom(t, "127.0.0.1", addr)
		return roundTrip(t, c, bufio.NewReader(c), "GET /healthz HTTP/1.1\r\nHost: sluice\r\nX-Forwarded-For: "+client+"\r\n\r\n")
	}
	resp, body := forwarded("198.51.100.7")
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, `"too_many_connections"`) || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("a second request of the streaming client: %d %s, want 429 too_many_connections with Retry-After 1", resp.StatusCode, body)
	}
	if resp, body := forwarded("198.51.100.8"); resp.StatusCode != 200 {
		t.Fatalf("another client of the proxy: %d %s", resp.StatusCode, body)
	}
	_ = stream.Close()
	waitFor(t, "the stream's place given back", func() bool {
		resp, _ := forwarded("198.51.100.7")
		return resp.StatusCode == 200
	})
}

// A connection refused while the client sends its request slowly, or a
// body after it, still gets its answer: the refusal reads the request's
// head first and drains the rest, so closing does not reset the answer
// away.
func TestRefusedConnectionWithABodyIsAnswered(t *testing.T) {
	_, _, addr := serve(t, func(c *config.Config) { c.API.MaxConnsPerIP = 1; c.API.MaxConns = 2 })
	held := dialFrom(t, "127.0.0.1", addr)
	if resp, _ := roundTrip(t, held, bufio.NewReader(held), getHealthz); resp.StatusCode != 200 {
		t.Fatalf("healthz: %d", resp.StatusCode)
	}
	c := dialFrom(t, "127.0.0.1", addr)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	body := strings.Repeat("x", 200<<10)
	go func() {
		_, _ = io.WriteString(c, "POST /v1/chat HTTP/1.1\r\nHost: sluice\r\n")
		time.Sleep(100 * time.Millisecond)
		_, _ = io.WriteString(c, "Content-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read the refusal: %v", err)
	}
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
}

// expectRefused dials addr from the local IP from and requires the
// refusal of a connection beyond a cap: status, the API's error body with
// code, a Retry-After, and the connection closed after it.
func expectRefused(t *testing.T, addr, from string, status int, code string) {
	t.Helper()
	c := dialFrom(t, from, addr)
	resp, body := roundTrip(t, c, bufio.NewReader(c), getHealthz)
	var e struct {
		Error struct {
			Code, Message string
			RetryAfter    int `json:"retry_after_s"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("refusal body from %s %q: %v", from, body, err)
	}
	if resp.StatusCode != status || e.Error.Code != code || e.Error.Message == "" || resp.Header.Get("Retry-After") != "1" || e.Error.RetryAfter != 1 {
		t.Fatalf("connection from %s: %d %q Retry-After %q, want %d %s with Retry-After 1", from, resp.StatusCode, body, resp.Header.Get("Retry-After"), status, code)
	}
	if resp.Header.Get("Content-Type") != "application/json" || !resp.Close {
		t.Fatalf("refusal headers %v: want JSON and Connection: close", resp.Header)
	}
	expectClosed(t, c, 3*time.Second)
	_ = c.Close()
}

// metricsText is the server's /metrics page.
func metricsText(t *testing.T, srv *Server) string {
	t.Helper()
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return rec.Body.String()
}

// A refused request's head is read to its blank line however the reads
// split it, and no further: what follows is the answer's to wait for.
func TestReadHeadFindsASplitBlankLine(t *testing.T) {
	server, client := net.Pipe()
	defer server.Close()
	defer client.Close()
	head := "GET /healthz HTTP/1.1\r\nHost: sluice\r\n\r\n"
	go func() {
		for i := range len(head) {
			_, _ = client.Write([]byte{head[i]})
		}
		_, _ = client.Write([]byte("next"))
	}()
	_ = server.SetDeadline(time.Now().Add(5 * time.Second))
	if !readHead(server) {
		t.Fatal("readHead: nothing read")
	}
	rest := make([]byte, 4)
	if _, err := io.ReadFull(server, rest); err != nil || string(rest) != "next" {
		t.Fatalf("after the head: %q, %v; want the next bytes unread", rest, err)
	}
}
