package chaos

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	sreq "github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/chatclient"
	"github.com/sluice-dev/sluice/workflows"
)

// crowd is how many clients hang up at random moments, arriving over
// crowdSpread, each gone within crowdLeave of sending.
const (
	crowd       = 1000
	crowdSpread = 10 * time.Second
	crowdLeave  = 4 * time.Second
)

// testClientsDisconnect sends 1,000 clients that each hang up at a random
// moment: before their headers, waiting at the door or in the queue, or
// mid-answer. Afterwards nothing they held may be left.
func testClientsDisconnect(t *testing.T) {
	slow(t)
	s := startStack(t, stackOptions{configure: func(cfg *config.Config) {
		// More permits: more of the crowd leaves mid-answer, fewer at
		// the door.
		cfg.Pools.Short.MaxConcurrency = 16
	}})
	rs := chatclient.Crowd(crowd, crowdSpread, crowdLeave, rand.New(rand.NewPCG(1, 2)), func(_ int, leave time.Duration) *chatclient.Result {
		return s.send(context.Background(), tenantLoad, chatclient.Request{MaxTokens: 40, Bound: time.Minute, LeaveAfter: leave})
	})
	gone := time.Now()
	recovered := s.timeToRecover(gone, tenantAfter, time.Minute)
	started, err := s.accounts().ListChats(context.Background(), "SluiceTenant = '"+tenantLoad+"'")
	if err != nil {
		t.Fatal(err)
	}
	notes := fmt.Sprintf("%d clients over %s, each hanging up %s–%s after sending (uniform); 16 permits; %d had started a workflow; %s",
		crowd, crowdSpread, time.Millisecond, crowdLeave, len(started), whenLeft(rs))
	s.finishScenario(t, row{fault: fmt.Sprintf("%d clients disconnecting at random moments", crowd), recover: recovered,
		recoverTo: "last client gone → first new request answered", notes: notes}, rs, nil, tenantLoad, tenantAfter)
}

// testSlowReader opens a request whose client reads its headers and then
// nothing, with a small receive buffer, while other clients are served.
// The server must drop it once a write has blocked for
// api.stream_write_timeout, and the request must end and give its permit
// back, without holding up anyone else.
func testSlowReader(t *testing.T) {
	// Timed to the second against a busy worker: in make chaos, not in the
	// race-detector run of make test, which runs packages side by side
	// (api's TestSlowSSEReaderIsDroppedAndDetached covers the drop there).
	slow(t)
	s := startStack(t, stackOptions{
		simulator: func(c *llmsim.Config) {
			// Long answers, produced fast (about 200 tokens a second): the
			// stalled client's receive buffer and the server's send buffer
			// (which cannot grow past what a tiny window lets through) fill
			// within seconds.
			c.AnswerMinTokens, c.AnswerMaxTokens = 7000, 8000
			c.TimeScale = 0.3
		},
		configure: func(cfg *config.Config) { cfg.API.MaxTokensLimit = 8000 },
	})
	others := s.startLoad(2, constTenant(tenantAfter), chatclient.Request{MaxTokens: 30, Bound: 30 * time.Second})
	conn, id := s.openUnread(t, 8000)
	defer conn.Close()
	stopped := time.Now()
	status, took := s.waitClosed(t, id, time.Minute)
	detached := s.signalledAt(t, id, workflows.SignalDetach)
	rs := others.Stop()
	data, extra := drainDropped(conn)
	// The server's write blocked once the buffers were full, right after
	// the last event the client got; it must drop the client within its
	// write timeout of that (and some slack for the hub and the detach
	// signal on a busy machine).
	blocked := lastEventTime(data)
	switch d := detached.Sub(blocked); {
	case blocked.IsZero():
		extra = append(extra, fmt.Sprintf("the stalled client of %s got no event", id))
	case detached.IsZero():
		extra = append(extra, fmt.Sprintf("the stalled client of %s was never detached (no detach signal in its history)", id))
	case d > s.cfg.API.StreamWriteTimeout+3*time.Second:
		extra = append(extra, fmt.Sprintf("the stalled client of %s was dropped %s after its last event was sent (api.stream_write_timeout %s)", id, d.Round(time.Millisecond), s.cfg.API.StreamWriteTimeout))
	}
	// Then the grace, a timer, the stop flag and Finalize: a few workflow
	// tasks, each of which can wait seconds for a worker this busy (two
	// cores, -race).
	if d := took - detached.Sub(stopped); took < 0 || d > s.cfg.API.DisconnectGrace+15*time.Second {
		extra = append(extra, fmt.Sprintf("the stalled client's request %s ended %s after it was dropped", id, secs(d)))
	}
	if status != sreq.OutcomeCancelled+" "+sreq.ReasonCancelled {
		extra = append(extra, fmt.Sprintf("the stalled client's request %s ended %q, want cancelled", id, status))
	}
	served := answeredAfter(rs, stopped)
	if served == 0 {
		extra = append(extra, "no other client was answered while one stopped reading")
	}
	notes := fmt.Sprintf("one client reads its headers, then nothing (4 KiB receive buffer, 536-byte segments), for an 8,000-token answer, while 2 other clients run a closed loop; "+
		"%d KiB reached its buffers; the server dropped it %s after its last event went out (api.stream_write_timeout %s), and its request was cancelled, its permit given back, %s after that (disconnect grace %s); %d other requests answered meanwhile",
		len(data)>>10, detached.Sub(blocked).Round(100*time.Millisecond), s.cfg.API.StreamWriteTimeout, secs(took-detached.Sub(stopped)), s.cfg.API.DisconnectGrace, served)
	s.finishScenario(t, row{fault: "a client that stops reading", recover: took - blocked.Sub(stopped),
		recoverTo: "its last event sent → client dropped, request cancelled, permit back", notes: notes}, rs, extra, tenantLoad, tenantAfter)
}

// openUnread sends a chat request on a raw connection with a small
// receive buffer, reads the response headers byte by byte (so nothing of
// the body is read ahead) and returns the connection and request id.
func (s *stack) openUnread(t *testing.T, maxTokens int) (*net.TCPConn, string) {
	t.Helper()
	u, _ := url.Parse(s.baseURL)
	// Set before connecting: the window the connection opens with is
	// already small, and the segment size it announces is the smallest
	// an IPv4 path must take, not loopback's 64 KiB — with which the
	// server's send buffer would grow to megabytes and swallow the whole
	// answer.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var errs []error
		err := rc.Control(func(fd uintptr) {
			errs = append(errs,
				syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096),
				syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 536))
		})
		return errors.Join(append(errs, err)...)
	}}
	c, err := d.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	conn := c.(*net.TCPConn)
	body := fmt.Sprintf(`{"query":%q,"max_tokens":%d}`, chatclient.DefaultQuery, maxTokens)
	req := fmt.Sprintf("POST /v1/chat HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s",
		u.Host, s.nextKey(tenantLoad), len(body), body)
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	var head bytes.Buffer
	one := make([]byte, 1)
	for !bytes.HasSuffix(head.Bytes(), []byte("\r\n\r\n")) {
		if _, err := conn.Read(one); err != nil {
			t.Fatalf("read response headers: %v (so far %q)", err, head.String())
		}
		head.Write(one)
	}
	resp, err := http.ReadResponse(bufioReader(head.Bytes()), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("response %v %v", resp, err)
	}
	return conn, resp.Header.Get("X-Request-ID")
}

// waitClosed waits for a request's workflow to close and returns its
// outcome ("outcome reason") and how long that took (-1: not within).
func (s *stack) waitClosed(t *testing.T, id string, within time.Duration) (string, time.Duration) {
	start := time.Now()
	for time.Since(start) < within {
		desc, err := s.tc.DescribeWorkflow(context.Background(), workflows.ChatWorkflowID(id), "")
		if err == nil && desc.Status != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
			took := time.Since(start)
			var res workflows.ChatResult
			if err := s.tc.GetWorkflow(context.Background(), workflows.ChatWorkflowID(id), "").Get(context.Background(), &res); err != nil {
				t.Errorf("result of %s: %v", id, err)
			}
			return strings.TrimSpace(res.Outcome + " " + res.Reason), took
		}
		time.Sleep(100 * time.Millisecond)
	}
	return "", -1
}

// drainDropped reads what the server had sent the stalled client: the
// connection must end (the server dropped it), and without a terminal
// event (it was cut, not finished).
func drainDropped(conn *net.TCPConn) ([]byte, []string) {
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	data, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return data, []string{fmt.Sprintf("the server never dropped the stalled client's connection (%d bytes read from it in 15 s)", len(data))}
	}
	for _, end := range []string{"event: done", "event: error", "event: rejected"} {
		if strings.Contains(string(data), end) {
			return data, []string{fmt.Sprintf("the stalled client's stream was finished (%s), not dropped", end)}
		}
	}
	return data, nil
}

// lastEventTime is when the last whole event in an SSE body was written:
// its id is its Redis stream entry id, "<ms>-<seq>".
func lastEventTime(data []byte) time.Time {
	var last time.Time
	for _, line := range strings.Split(string(data), "\n") {
		id, ok := strings.CutPrefix(line, "id: ")
		if !ok {
			continue
		}
		ms, _, _ := strings.Cut(id, "-")
		if n, err := strconv.ParseInt(ms, 10, 64); err == nil {
			last = time.UnixMilli(n)
		}
	}
	return last
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }

// signalledAt is when a request's workflow first got a signal (zero
// time: never).
func (s *stack) signalledAt(t *testing.T, id, name string) time.Time {
	it := s.tc.GetWorkflowHistory(context.Background(), workflows.ChatWorkflowID(id), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			t.Errorf("history of %s: %v", id, err)
			return time.Time{}
		}
		if a := ev.GetWorkflowExecutionSignaledEventAttributes(); a != nil && a.GetSignalName() == name {
			return ev.GetEventTime().AsTime()
		}
	}
	return time.Time{}
}

// whenLeft says at what point the clients that left did.
func whenLeft(rs []*chatclient.Result) string {
	var before, waiting, mid int
	for _, r := range rs {
		switch {
		case !r.Left:
		case r.Status == 0:
			before++
		case r.Tokens == 0:
			waiting++
		default:
			mid++
		}
	}
	return fmt.Sprintf("%d left before their response headers, %d after them but before a token (at the door, queued or before the first token), %d mid-answer", before, waiting, mid)
}
