package llm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/openai"
)

// answer writes a whole streamed answer of the given tokens.
func answer(w http.ResponseWriter, tokens ...string) {
	for _, tok := range tokens {
		fmt.Fprintf(w, `data: {"choices":[{"index":0,"delta":{"content":%q}}]}`+"\n\n", tok)
	}
	fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
}

// flush sends what the handler wrote so far.
func flush(w http.ResponseWriter) { _ = http.NewResponseController(w).Flush() }

// hangingServer answers with a stream that sends the given tokens (and
// the headers) at once, then nothing.
func hangingServer(t *testing.T, tokens ...string) string {
	return chatServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for _, tok := range tokens {
			fmt.Fprintf(w, `data: {"choices":[{"index":0,"delta":{"content":%q}}]}`+"\n\n", tok)
		}
		flush(w)
		<-r.Context().Done()
	}).URL
}

// chatServer serves handler at the chat completions path. The request's
// context also ends with the test, so that a handler that waits for it
// cannot hold up the server's Close.
func chatServer(t *testing.T, handler http.HandlerFunc) *httptest.Server {
	t.Helper()
	testDone, end := context.WithCancel(context.Background())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		stop := context.AfterFunc(testDone, cancel)
		defer stop()
		handler(w, r.WithContext(ctx))
	}))
	// Cleanups run last in, first out: the handlers are released first.
	t.Cleanup(srv.Close)
	t.Cleanup(end)
	return srv
}

func TestFirstTokenDeadline(t *testing.T) {
	for name, url := range map[string]string{
		"headers, then silence": hangingServer(t),
		"no headers": chatServer(t, func(_ http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		}).URL,
		"keep-alive comments only": chatServer(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for {
				fmt.Fprint(w, ": keep-alive\n\n")
				fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n")
				flush(w)
				select {
				case <-r.Context().Done():
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}).URL,
	} {
		t.Run(name, func(t *testing.T) {
			c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{url}, Deadlines: Deadlines{FirstToken: 150 * time.Millisecond}})
			began := time.Now()
			res, err := c.Stream(context.Background(), Request{}, func(Delta) error { return nil })
			var e *Error
			if !errors.As(err, &e) || e.Deadline != DeadlineFirstToken || !e.Retryable || res.Chunks != 0 {
				t.Fatalf("err %v (%+v), chunks %d: want a retryable first-token deadline", err, e, res.Chunks)
			}
			if !strings.Contains(err.Error(), EndpointName("", 0)) || !strings.Contains(err.Error(), "first-token deadline: no token within 150ms") {
				t.Errorf("error %q should name the endpoint and the deadline", err)
			}
			if strings.Contains(err.Error(), strings.TrimPrefix(url, "http://")) {
				t.Errorf("error %q names the endpoint's address", err)
			}
			if took := time.Since(began); took > 2*time.Second {
				t.Errorf("deadline of 150ms took %s", took)
			}
		})
	}
}

func TestTokenIdleDeadline(t *testing.T) {
	url := hangingServer(t, "Hel", "lo")
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{url}, Deadlines: Deadlines{FirstToken: 5 * time.Second, TokenIdle: 150 * time.Millisecond}})
	var got strings.Builder
	res, err := c.Stream(context.Background(), Request{}, func(d Delta) error { got.WriteString(d.Text); return nil })
	var e *Error
	if !errors.As(err, &e) || e.Deadline != DeadlineTokenIdle || e.Retryable || res.Chunks != 2 || got.String() != "Hello" {
		t.Fatalf("err %v (%+v), %d chunks %q: want a token-idle deadline after 2 tokens, not retryable", err, e, res.Chunks, got.String())
	}
	if want := "token-idle deadline: no token for 150ms after token 2"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q, want it to say %q", err, want)
	}
}

// The idle deadline times the backend, not the caller: a slow onDelta
// (a Redis write under load) does not cut a healthy stream.
func TestSlowCallerIsNotIdleBackend(t *testing.T) {
	srv := sseServer(t, func(w http.ResponseWriter, _ openai.ChatRequest) { answer(w, "a", "b", "c") })
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{srv.URL}, Deadlines: Deadlines{FirstToken: time.Second, TokenIdle: 50 * time.Millisecond}})
	res, err := c.Stream(context.Background(), Request{}, func(Delta) error {
		time.Sleep(120 * time.Millisecond)
		return nil
	})
	if err != nil || res.Chunks != 3 {
		t.Fatalf("%+v %v: a slow caller must not trip the idle deadline", res, err)
	}
}

func TestCallerCancelIsNotADeadline(t *testing.T) {
	url := hangingServer(t)
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{url}})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.Stream(ctx, Request{}, func(Delta) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the caller's context error", err)
	}
}

func TestDefaultDeadlines(t *testing.T) {
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{"http://127.0.0.1:1"}, Deadlines: Deadlines{TokenIdle: time.Second}})
	if want := (Deadlines{Connect: 10 * time.Second, FirstToken: 30 * time.Second, TokenIdle: time.Second}); c.deadlines != want {
		t.Fatalf("deadlines %+v, want %+v", c.deadlines, want)
	}
}
