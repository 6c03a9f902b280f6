package chatclient

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// fakeAPI answers POST /v1/chat with the SSE body stream, or with status
// and retryAfter when status is not 200.
func fakeAPI(t *testing.T, status int, retryAfter, stream string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer k" {
			t.Errorf("authorization %q, want the request's key", r.Header.Get("Authorization"))
		}
		w.Header().Set("X-Request-ID", "req-1")
		if status != http.StatusOK {
			if retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			w.WriteHeader(status)
			fmt.Fprint(w, `{"error":{"code":"unavailable"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, stream)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func token(id string, i int) string {
	return fmt.Sprintf("id: %s\nevent: token\ndata: {\"text\":\"t\",\"index\":%d}\n\n", id, i)
}

const done = "id: 9-0\nevent: done\ndata: {\"finish_reason\":\"stop\",\"usage\":{\"completion_tokens\":2}}\n\n"

func TestSendJudgesWhatTheClientSaw(t *testing.T) {
	for _, tc := range []struct {
		name       string
		status     int
		retryAfter string
		stream     string
		outcome    string
		ok         bool
	}{
		{"answered", 200, "", token("1-0", 0) + token("2-0", 1) + done, "answered", true},
		{"token repeated", 200, "", token("1-0", 0) + token("2-0", 0) + done, "answered", false},
		{"event after the end", 200, "", token("1-0", 0) + done + token("3-0", 1), "answered", false},
		{"stream cut", 200, "", token("1-0", 0), "STREAM CUT", false},
		{"failure", 200, "", "event: error\ndata: {\"reason\":\"stream_interrupted\",\"retry_after_s\":2}\n\n", "error stream_interrupted", true},
		{"503 with Retry-After", 503, "1", "", "503 unavailable", true},
		{"503 without Retry-After", 503, "", "", "503 unavailable", false},
		{"429 without Retry-After", 429, "", "", "429 unavailable", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := fakeAPI(t, tc.status, tc.retryAfter, tc.stream)
			r := Send(context.Background(), srv.Client(), srv.URL, Request{Key: "k", Bound: 5 * time.Second})
			if r.Outcome() != tc.outcome || r.OK() != tc.ok {
				t.Errorf("got %s, OK %v; want %s, OK %v", r.Summary(), r.OK(), tc.outcome, tc.ok)
			}
			if r.ID != "req-1" || r.Key != "k" {
				t.Errorf("id %q key %q", r.ID, r.Key)
			}
		})
	}
}

func TestReadStopsAtMaxTokensAndKeepsTheLastID(t *testing.T) {
	r := &Result{}
	r.Read(strings.NewReader(token("1-0", 0)+token("2-0", 1)+token("3-0", 2)+done), 2)
	if r.Tokens != 2 || r.LastID != "2-0" || r.Terminal != "" {
		t.Fatalf("after 2 tokens: %d tokens, last id %q, terminal %q", r.Tokens, r.LastID, r.Terminal)
	}
	r.Read(strings.NewReader(token("3-0", 2)+done), -1)
	if r.Tokens != 3 || r.Terminal != "done" || r.Finish != "stop" || r.Completion != 2 || len(r.Violations) > 0 {
		t.Fatalf("resumed: %s, finish %q, completion %d", r.Summary(), r.Finish, r.Completion)
	}
}

func TestSendCountsAClientThatHangsUpAsLeft(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	r := Send(context.Background(), srv.Client(), srv.URL, Request{Key: "k", LeaveAfter: 50 * time.Millisecond, Bound: 5 * time.Second})
	if !r.Left || r.Hung || r.Err != nil || !r.OK() {
		t.Fatalf("a client that left: %s (left %v, hung %v)", r.Summary(), r.Left, r.Hung)
	}
	r = Send(context.Background(), srv.Client(), srv.URL, Request{Key: "k", Bound: 100 * time.Millisecond})
	if !r.Hung || r.OK() {
		t.Fatalf("a client that waited its bound: %s (hung %v)", r.Summary(), r.Hung)
	}
}

func TestTallyCountsMostFirst(t *testing.T) {
	rs := []*Result{{Status: 503, Code: "unavailable"}, {Status: 200, Terminal: "done"}, {Status: 200, Terminal: "done"}}
	if got, want := Tally(rs), "2 answered, 1 503 unavailable"; got != want {
		t.Fatalf("Tally = %q, want %q", got, want)
	}
	if got := Broken(rs); len(got) != 1 || !strings.Contains(got[0], "without Retry-After") {
		t.Fatalf("Broken = %q, want the 503 without Retry-After", got)
	}
}
