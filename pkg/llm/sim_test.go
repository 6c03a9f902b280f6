package llm

import (
	"context"
	"errors"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/openai"
)

// simulator starts an llmsim server a hundred times faster than real
// time with fault, and returns it with its URL.
func simulator(t *testing.T, fault llmsim.Fault) (*llmsim.Server, string) {
	t.Helper()
	cfg := llmsim.DefaultConfig()
	cfg.TimeScale = 0.01
	cfg.Fault = fault
	sim, err := llmsim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(sim.Close)
	return sim, srv.URL
}

func simRequest(maxTokens int) Request {
	return Request{Model: "sluice-sim", MaxTokens: maxTokens, Messages: []openai.Message{openai.TextMessage("user", "what is a circuit breaker?")}}
}

// A replica that hangs before its first token costs each request the
// first-token deadline, until its circuit opens; then the pool routes
// around it, and the hung requests' slots are given back.
func TestSimulatorStalledReplicaIsRoutedAround(t *testing.T) {
	hung, hungURL := simulator(t, llmsim.Fault{StallFirstToken: true})
	_, healthyURL := simulator(t, llmsim.Fault{})
	c, _ := NewOpenAI(OpenAIOptions{
		Endpoints: []string{hungURL, healthyURL},
		Deadlines: Deadlines{FirstToken: 200 * time.Millisecond},
		Breaker:   Breaker{Failures: 2, OpenFor: time.Minute},
	})
	var deadlines, answers int
	for range 8 {
		res, err := c.Stream(context.Background(), simRequest(5), func(Delta) error { return nil })
		var e *Error
		switch {
		case err == nil && res.Chunks == 5:
			answers++
		case errors.As(err, &e) && e.Deadline == DeadlineFirstToken && e.Retryable:
			deadlines++
		default:
			t.Fatalf("stream: %+v %v", res, err)
		}
	}
	if deadlines != 2 || answers != 6 {
		t.Fatalf("%d deadlines, %d answers: want the hung replica dropped after 2", deadlines, answers)
	}
	if got := states(c); !slices.Equal(got, []CircuitState{CircuitOpen, CircuitClosed}) {
		t.Fatalf("circuits %v", got)
	}
	waitFor(t, "the hung requests aborted", func() bool { return hung.Stats().Running == 0 })
}

func TestSimulatorMidStreamStallIsInterrupted(t *testing.T) {
	_, url := simulator(t, llmsim.Fault{StallAfterTokens: 3})
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{url}, Deadlines: Deadlines{TokenIdle: 150 * time.Millisecond}})
	res, err := c.Stream(context.Background(), simRequest(10), func(Delta) error { return nil })
	var e *Error
	if !errors.As(err, &e) || e.Deadline != DeadlineTokenIdle || e.Retryable || res.Chunks != 3 {
		t.Fatalf("%+v %v: want a token-idle deadline after 3 tokens, not retryable", res, err)
	}
}

// A whole pool failing with 503 opens every circuit and fails fast; once
// the server heals, the probe closes the circuit again.
func TestSimulatorErrorsOpenAndHeal(t *testing.T) {
	sim, url := simulator(t, llmsim.Fault{ErrorStatus: 503})
	const openFor = 200 * time.Millisecond
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{url}, Breaker: Breaker{Failures: 3, OpenFor: openFor}})
	for range 3 {
		var e *Error
		if _, err := c.Stream(context.Background(), simRequest(5), func(Delta) error { return nil }); !errors.As(err, &e) || e.Status != 503 || !e.Retryable {
			t.Fatalf("err %v, want a retryable 503", err)
		}
	}
	var ue *UnavailableError
	if _, err := c.Stream(context.Background(), simRequest(5), func(Delta) error { return nil }); !errors.As(err, &ue) || ue.RetryAfter <= 0 || ue.RetryAfter > openFor {
		t.Fatalf("err %v, want unavailable with a retry-after up to %s", err, openFor)
	}
	if _, err := sim.Reconfigure(llmsim.ConfigUpdate{Fault: &llmsim.Fault{}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ue.RetryAfter + 20*time.Millisecond)
	if res, err := c.Stream(context.Background(), simRequest(5), func(Delta) error { return nil }); err != nil || res.Chunks != 5 {
		t.Fatalf("the probe: %+v %v", res, err)
	}
	if got := states(c)[0]; got != CircuitClosed {
		t.Fatalf("circuit %v after a good probe, want closed", got)
	}
}

// A replica whose steps are slow answers, but its first tokens are
// outliers; it is ejected while its healthy peer takes the traffic.
func TestSimulatorSlowReplicaIsEjected(t *testing.T) {
	// 5 simulated seconds a step is 50ms of wall time per token.
	_, slowURL := simulator(t, llmsim.Fault{TokenDelay: 5 * time.Second})
	_, fastURL := simulator(t, llmsim.Fault{})
	c, _ := NewOpenAI(OpenAIOptions{
		Endpoints: []string{slowURL, fastURL},
		Breaker:   Breaker{Failures: 2, OpenFor: time.Minute, SlowFirstToken: 20 * time.Millisecond},
	})
	for range 8 {
		if _, err := c.Stream(context.Background(), simRequest(2), func(Delta) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if got := states(c); !slices.Equal(got, []CircuitState{CircuitOpen, CircuitClosed}) {
		t.Fatalf("circuits %v, want the slow replica ejected", got)
	}
}

// A prompt longer than the model's context is refused with OpenAI's
// context_length_exceeded, which ContextTooLong tells from any other 400
// (a parameter the model does not take) and from a deadline.
func TestSimulatorContextTooLong(t *testing.T) {
	cfg := llmsim.DefaultConfig()
	cfg.TimeScale, cfg.MaxModelLen, cfg.RefuseParams = 0.01, 64, []string{"seed"}
	sim, err := llmsim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(sim.Close)
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{srv.URL}})
	long := simRequest(5)
	long.Messages = []openai.Message{openai.TextMessage("user", strings.Repeat("circuit breaker ", 100))}
	_, err = c.Stream(context.Background(), long, func(Delta) error { return nil })
	if !ContextTooLong(err) || FirstTokenMissed(err) || IsRetryable(err) {
		t.Fatalf("too long a prompt: %v, want a 400 context_length_exceeded", err)
	}
	if !strings.Contains(err.Error(), "context_length_exceeded") {
		t.Errorf("error %q does not carry the code", err)
	}
	refused := simRequest(5)
	seed := int64(7)
	refused.Sampling.Seed = &seed
	if _, err = c.Stream(context.Background(), refused, func(Delta) error { return nil }); err == nil || ContextTooLong(err) {
		t.Fatalf("an unsupported parameter: %v, want a 400 that is not context_length_exceeded", err)
	}
	if res, err := c.Stream(context.Background(), simRequest(5), func(Delta) error { return nil }); err != nil || res.Chunks != 5 {
		t.Fatalf("a short prompt: %+v %v", res, err)
	}
}
