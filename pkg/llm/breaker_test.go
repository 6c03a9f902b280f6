package llm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// endpointServer is a test backend that counts its requests and fails
// while broken is set.
type endpointServer struct {
	url    string
	hits   atomic.Int32
	broken atomic.Bool
}

// newBackend serves whole answers, or fail while broken.
func newBackend(t *testing.T, fail http.HandlerFunc) *endpointServer {
	t.Helper()
	e := &endpointServer{}
	e.url = chatServer(t, func(w http.ResponseWriter, r *http.Request) {
		e.hits.Add(1)
		if e.broken.Load() {
			fail(w, r)
			return
		}
		answer(w, "ok")
	}).URL
	return e
}

func unavailable503(w http.ResponseWriter, _ *http.Request) {
	http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
}

// streamOK streams one answer; it returns the endpoint that served it.
func streamOK(c *OpenAI) (string, error) {
	res, err := c.Stream(context.Background(), Request{}, func(Delta) error { return nil })
	return res.Endpoint, err
}

func states(c *OpenAI) []CircuitState {
	var out []CircuitState
	for _, ci := range c.Circuits() {
		out = append(out, ci.State)
	}
	return out
}

// Each way an endpoint can fail opens its circuit, and the round robin
// then sends everything to the healthy one.
func TestBreakerRoutesAroundBadEndpoint(t *testing.T) {
	for name, fail := range map[string]http.HandlerFunc{
		"503": unavailable503,
		"first-token deadline": func(_ http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		},
		"idle deadline": func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"content":"half"}}]}`+"\n\n")
			flush(w)
			<-r.Context().Done()
		},
		"broken stream": func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"content":"half"}}]}`+"\n\n")
		},
	} {
		t.Run(name, func(t *testing.T) {
			bad, good := newBackend(t, fail), newBackend(t, nil)
			bad.broken.Store(true)
			c, _ := NewOpenAI(OpenAIOptions{
				Endpoints: []string{bad.url, good.url},
				Deadlines: Deadlines{FirstToken: 100 * time.Millisecond, TokenIdle: 100 * time.Millisecond},
				Breaker:   Breaker{Failures: 3, OpenFor: time.Minute},
			})
			failed := 0
			for range 20 {
				if _, err := streamOK(c); err != nil {
					failed++
				}
			}
			if failed != 3 || bad.hits.Load() != 3 || good.hits.Load() != 17 {
				t.Fatalf("%d failed, bad served %d, good %d: want the bad one dropped after 3 failures",
					failed, bad.hits.Load(), good.hits.Load())
			}
			if got := states(c); !slices.Equal(got, []CircuitState{CircuitOpen, CircuitClosed}) {
				t.Fatalf("circuits %v, want open, closed", got)
			}
		})
	}
}

func TestBreakerHalfOpenProbe(t *testing.T) {
	flaky, good := newBackend(t, unavailable503), newBackend(t, nil)
	flaky.broken.Store(true)
	const openFor = 150 * time.Millisecond
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{flaky.url, good.url}, Breaker: Breaker{Failures: 1, OpenFor: openFor}})
	if _, err := streamOK(c); err == nil {
		t.Fatal("the broken endpoint answered")
	}
	// The probe of a circuit that is still broken opens it again.
	time.Sleep(openFor + 50*time.Millisecond)
	if got := states(c)[0]; got != CircuitHalfOpen {
		t.Fatalf("circuit %v after open_for, want half-open", got)
	}
	probeUntil(t, c, flaky, 2)
	if got := states(c)[0]; got != CircuitOpen {
		t.Fatalf("circuit %v after a failed probe, want open", got)
	}
	// A probe of a healed endpoint closes it, and it takes its turns again.
	flaky.broken.Store(false)
	time.Sleep(openFor + 50*time.Millisecond)
	probeUntil(t, c, flaky, 3)
	if got := states(c); !slices.Equal(got, []CircuitState{CircuitClosed, CircuitClosed}) {
		t.Fatalf("circuits %v after a good probe, want both closed", got)
	}
	before := flaky.hits.Load()
	for range 4 {
		if _, err := streamOK(c); err != nil {
			t.Fatal(err)
		}
	}
	if n := flaky.hits.Load() - before; n != 2 {
		t.Fatalf("the healed endpoint served %d of 4, want 2", n)
	}
}

// probeUntil streams until the flaky endpoint has seen hits requests; the
// round robin reaches it within two.
func probeUntil(t *testing.T, c *OpenAI, flaky *endpointServer, hits int32) {
	t.Helper()
	for range 2 {
		_, _ = streamOK(c)
		if flaky.hits.Load() == hits {
			return
		}
	}
	t.Fatalf("the endpoint saw %d requests, want %d", flaky.hits.Load(), hits)
}

// A probe's first token decides it: the circuit closes while the answer
// still streams. Until then no other stream gets through.
func TestBreakerProbeDecidedByFirstToken(t *testing.T) {
	broken := atomic.Bool{}
	broken.Store(true)
	firstSent := make(chan struct{})
	finish := make(chan struct{})
	url := chatServer(t, func(w http.ResponseWriter, r *http.Request) {
		if broken.Load() {
			unavailable503(w, r)
			return
		}
		fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"content":"first"}}]}`+"\n\n")
		flush(w)
		close(firstSent)
		<-finish
		answer(w, " rest")
	}).URL
	const openFor = 100 * time.Millisecond
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{url}, Breaker: Breaker{Failures: 1, OpenFor: openFor}})
	if _, err := streamOK(c); err == nil {
		t.Fatal("the broken endpoint answered")
	}
	broken.Store(false)
	time.Sleep(openFor + 50*time.Millisecond)

	gotFirst := make(chan struct{})
	probe := make(chan error, 1)
	go func() {
		first := true
		_, err := c.Stream(context.Background(), Request{}, func(Delta) error {
			if first {
				first = false
				close(gotFirst)
			}
			return nil
		})
		probe <- err
	}()
	<-firstSent
	<-gotFirst
	if got := states(c)[0]; got != CircuitClosed {
		t.Fatalf("circuit %v after the probe's first token, want closed", got)
	}
	close(finish)
	if err := <-probe; err != nil {
		t.Fatal(err)
	}
}

func TestBreakerAllOpenFailsFast(t *testing.T) {
	a, b := newBackend(t, unavailable503), newBackend(t, unavailable503)
	a.broken.Store(true)
	b.broken.Store(true)
	const openFor = 5 * time.Second
	c, _ := NewOpenAI(OpenAIOptions{Name: "short", Endpoints: []string{a.url, b.url}, Breaker: Breaker{Failures: 2, OpenFor: openFor}})
	for range 4 {
		if _, err := streamOK(c); !IsRetryable(err) {
			t.Fatalf("a 503 should be retryable: %v", err)
		}
	}
	began := time.Now()
	_, err := streamOK(c)
	var ue *UnavailableError
	if !errors.Is(err, ErrUnavailable) || !errors.As(err, &ue) || IsRetryable(err) {
		t.Fatalf("err %v, want ErrUnavailable", err)
	}
	if ue.Pool != "short" || ue.Endpoints != 2 || ue.RetryAfter <= openFor-time.Second || ue.RetryAfter > openFor {
		t.Fatalf("%+v: want pool short, 2 endpoints, retry after just under %s", ue, openFor)
	}
	if took := time.Since(began); took > 100*time.Millisecond || a.hits.Load()+b.hits.Load() != 4 {
		t.Fatalf("took %s and sent %d requests: want a fast failure that sends nothing", took, a.hits.Load()+b.hits.Load())
	}
}

func TestBreakerHalfOpenWithProbeRunningIsUnavailable(t *testing.T) {
	broken := atomic.Bool{}
	broken.Store(true)
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	url := chatServer(t, func(w http.ResponseWriter, r *http.Request) {
		if broken.Load() {
			unavailable503(w, r)
			return
		}
		arrived <- struct{}{}
		<-release
		answer(w, "ok")
	}).URL
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{url}, Breaker: Breaker{Failures: 1, OpenFor: 50 * time.Millisecond}})
	_, _ = streamOK(c)
	broken.Store(false)
	time.Sleep(100 * time.Millisecond)
	probe := make(chan error, 1)
	go func() { _, err := streamOK(c); probe <- err }()
	<-arrived
	var ue *UnavailableError
	if _, err := streamOK(c); !errors.As(err, &ue) || ue.RetryAfter != 0 {
		t.Fatalf("err %v: want unavailable with no wait while the probe runs", err)
	}
	close(release)
	if err := <-probe; err != nil {
		t.Fatal(err)
	}
	if got := states(c)[0]; got != CircuitClosed {
		t.Fatalf("circuit %v after the probe, want closed", got)
	}
}

// A slower first token than the breaker's threshold ejects an outlier,
// but never the last closed endpoint: a pool that is slow all over is
// loaded, not broken.
func TestBreakerEjectsSlowOutlier(t *testing.T) {
	slowAnswer := func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(80 * time.Millisecond)
		answer(w, "late")
	}
	slow, fast := newBackend(t, slowAnswer), newBackend(t, nil)
	slow.broken.Store(true)
	c, _ := NewOpenAI(OpenAIOptions{
		Endpoints: []string{slow.url, fast.url},
		Breaker:   Breaker{Failures: 2, OpenFor: time.Minute, SlowFirstToken: 30 * time.Millisecond},
	})
	for range 10 {
		if _, err := streamOK(c); err != nil {
			t.Fatalf("a slow answer is still an answer: %v", err)
		}
	}
	if got := states(c); !slices.Equal(got, []CircuitState{CircuitOpen, CircuitClosed}) || slow.hits.Load() != 2 {
		t.Fatalf("circuits %v, slow served %d: want the slow one ejected after 2", got, slow.hits.Load())
	}

	alone := newBackend(t, slowAnswer)
	alone.broken.Store(true)
	c, _ = NewOpenAI(OpenAIOptions{Endpoints: []string{alone.url}, Breaker: Breaker{Failures: 2, SlowFirstToken: 30 * time.Millisecond}})
	for range 4 {
		if _, err := streamOK(c); err != nil {
			t.Fatal(err)
		}
	}
	if got := states(c)[0]; got != CircuitClosed {
		t.Fatalf("the only endpoint's circuit %v, want closed", got)
	}
}

// What the request or its caller did says nothing about the endpoint.
func TestBreakerIgnoresCallerAndRequestFaults(t *testing.T) {
	e := newBackend(t, func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"message":"prompt too long"}}`, http.StatusBadRequest)
	})
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{e.url}, Breaker: Breaker{Failures: 1}})
	e.broken.Store(true)
	for range 3 {
		if _, err := streamOK(c); err == nil || IsRetryable(err) {
			t.Fatalf("a 400 should fail for good: %v", err)
		}
	}
	e.broken.Store(false)
	stop := errors.New("client gone")
	for range 3 {
		if _, err := c.Stream(context.Background(), Request{}, func(Delta) error { return stop }); !errors.Is(err, stop) {
			t.Fatalf("err %v, want the caller's", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := c.Stream(ctx, Request{}, func(Delta) error { return nil }); !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want the caller's cancel", err)
		}
	}
	if got := states(c)[0]; got != CircuitClosed {
		t.Fatalf("circuit %v, want closed", got)
	}
}

func TestBreakerOpensOnConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close()
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{refused}, Breaker: Breaker{Failures: 2}})
	for range 2 {
		if _, err := streamOK(c); !IsRetryable(err) {
			t.Fatalf("connection refused should be retryable: %v", err)
		}
	}
	if _, err := streamOK(c); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("err %v, want ErrUnavailable", err)
	}
}

func TestDefaultBreaker(t *testing.T) {
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{"http://127.0.0.1:1"}, Breaker: Breaker{OpenFor: time.Second}})
	if want := (Breaker{Failures: 5, OpenFor: time.Second, SlowFirstToken: 10 * time.Second}); c.breaker != want {
		t.Fatalf("breaker %+v, want %+v", c.breaker, want)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Circuits name endpoints by pool and index, never by URL: the scrape
// that shows them may be public, and a URL can carry credentials.
func TestCircuitsNameEndpointsNotURLs(t *testing.T) {
	c, err := NewOpenAI(OpenAIOptions{Name: "short", Endpoints: []string{"http://user:secret@10.1.2.3:8000", "http://10.1.2.4:8000/v1"}})
	if err != nil {
		t.Fatal(err)
	}
	for i, ci := range c.Circuits() {
		if want := fmt.Sprintf("short-%d", i); ci.Endpoint != want {
			t.Errorf("circuit %d named %q, want %q", i, ci.Endpoint, want)
		}
	}
}
