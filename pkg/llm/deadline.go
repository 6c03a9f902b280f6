package llm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// Deadline names, as Error.Deadline reports which one passed.
const (
	DeadlineConnect    = "connect"
	DeadlineFirstToken = "first_token"
	DeadlineTokenIdle  = "token_idle"
)

// Deadlines bound how long a stream waits on its endpoint, so that a
// replica that hangs costs a request seconds instead of the whole LLM
// timeout. Zero fields take DefaultDeadlines' values.
type Deadlines struct {
	// Connect bounds opening a connection: the TCP connect, and the TLS
	// handshake for https. Only the HTTP client NewOpenAI builds applies
	// it; a caller's own HTTPClient brings its own.
	Connect time.Duration
	// FirstToken bounds the wait from sending a request to its first
	// piece of content: connecting, the backend's queue and its prefill.
	FirstToken time.Duration
	// TokenIdle bounds the backend's silence between two pieces of
	// content. Time the caller's onDelta takes is not the backend's and
	// is not counted.
	TokenIdle time.Duration
}

// DefaultDeadlines suit a real model: a first token can take seconds
// when the backend queues or prefills a long prompt, while a healthy
// decoder emits several tokens a second.
func DefaultDeadlines() Deadlines {
	return Deadlines{Connect: 10 * time.Second, FirstToken: 30 * time.Second, TokenIdle: 15 * time.Second}
}

// newHTTPClient is a client with no overall timeout (the caller's context
// and the stream's deadlines bound a stream) that gives up connecting
// after connect.
func newHTTPClient(connect time.Duration) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: connect,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

// deadlinePassed is the cause a watchdog cancels its stream with.
type deadlinePassed struct {
	name  string
	after time.Duration
	// tokens is how many pieces of content came before the silence.
	tokens int64
}

func (d *deadlinePassed) Error() string {
	if d.name == DeadlineFirstToken {
		return fmt.Sprintf("first-token deadline: no token within %s", d.after)
	}
	return fmt.Sprintf("token-idle deadline: no token for %s after token %d", d.after, d.tokens)
}

// watchdog cancels a stream whose endpoint stays silent too long: first
// until the first piece of content, then between any two.
type watchdog struct {
	idle   time.Duration
	timer  *time.Timer
	cancel context.CancelCauseFunc
	// tokens is read by the timer's goroutine.
	tokens atomic.Int64
}

// watch returns the stream's context, cancelled with a *deadlinePassed
// cause when a deadline passes, and its watchdog, which must be stopped.
func watch(ctx context.Context, d Deadlines) (context.Context, *watchdog) {
	sctx, cancel := context.WithCancelCause(ctx)
	w := &watchdog{idle: d.TokenIdle, cancel: cancel}
	w.timer = time.AfterFunc(d.FirstToken, func() {
		n := w.tokens.Load()
		if n == 0 {
			cancel(&deadlinePassed{name: DeadlineFirstToken, after: d.FirstToken})
			return
		}
		cancel(&deadlinePassed{name: DeadlineTokenIdle, after: d.TokenIdle, tokens: n})
	})
	return sctx, w
}

// pause stops the clock when a piece of content arrives, while the caller
// handles it.
func (w *watchdog) pause() {
	w.timer.Stop()
	w.tokens.Add(1)
}

// resume starts the idle clock for the next piece of content.
func (w *watchdog) resume() { w.timer.Reset(w.idle) }

func (w *watchdog) stop() {
	w.timer.Stop()
	w.cancel(nil)
}

// passed reports the deadline that cancelled sctx, if one did.
func passed(sctx context.Context) (*deadlinePassed, bool) {
	var d *deadlinePassed
	ok := errors.As(context.Cause(sctx), &d)
	return d, ok
}

// connectTimedOut reports a dial that gave up after the connect deadline.
func connectTimedOut(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" && op.Timeout()
}
