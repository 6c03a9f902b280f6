package vtc

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// The replay's reader counts a token per chunk with text, skips Sluice's
// comments and the finish chunk, and keeps the usage and the route.
func TestReplayReadsAnOpenAIStream(t *testing.T) {
	body := ": accepted\n\n: queued position=3 estimated_wait_ms=1200\n\n" +
		`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"Fair"},"finish_reason":null}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{"content":" queues"},"finish_reason":null}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}],"sluice":{"route":"long"}}` + "\n\n" +
		`data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}` + "\n\n" +
		"data: [DONE]\n\n"
	rp := &Replay{Speed: 4}
	rp.Begin()
	o := rp.read(context.Background(), strings.NewReader(body))
	if o.Kind != Done || o.Tokens != 2 || o.Route != "long" || !o.HasUsage || o.PromptUsage != 12 || o.OutputUsage != 2 {
		t.Errorf("outcome %+v", o)
	}
	if o.First <= 0 || o.Last < o.First {
		t.Errorf("token times %v..%v", o.First, o.Last)
	}
	// An error object ends the stream with its code; a stream that stops
	// short is no answer.
	o = rp.read(context.Background(), strings.NewReader(`data: {"error":{"code":"queue_timeout"}}`+"\n\n"))
	if o.Kind != "error queue_timeout" {
		t.Errorf("error stream: %+v", o)
	}
	o = rp.read(context.Background(), strings.NewReader(`data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}`+"\n\n"))
	if o.Kind != "stream ended without [DONE]" || o.Tokens != 1 {
		t.Errorf("short stream: %+v", o)
	}
}

// A replay to two URLs sends row i to the (i mod 2)th, so that a client
// with several requests reaches both; each row's headers go with it,
// and every request is read to its end.
func TestReplaySplitsRowsAcrossURLs(t *testing.T) {
	var mu sync.Mutex
	got := map[string][]string{} // server -> clients, in arrival order
	serve := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got[name] = append(got[name], r.Header.Get("X-Client"))
			mu.Unlock()
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, `data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}`+"\n\n"+"data: [DONE]\n\n")
		}))
	}
	a, b := serve("a"), serve("b")
	defer a.Close()
	defer b.Close()
	rows := []Row{{Arrival: 0, Client: "x"}, {Arrival: 0.1, Client: "x"}, {Arrival: 0.2, Client: "y"}, {Arrival: 0.3, Client: "x"}}
	rp := &Replay{
		Target: Target{System: Sluice, URLs: []string{a.URL, b.URL}, Client: &http.Client{},
			Headers: func(r Row) map[string]string { return map[string]string{"X-Client": r.Client} }},
		Rows: rows, Bodies: make([][]byte, len(rows)), Speed: 10, Until: 60,
	}
	rp.Begin()
	rp.Run(context.Background())
	// Arrivals 10 ms apart on the wall clock: each server's requests
	// come in order.
	if strings.Join(got["a"], ",") != "x,y" || strings.Join(got["b"], ",") != "x,x" {
		t.Errorf("server a got %v, b got %v; want x,y and x,x", got["a"], got["b"])
	}
	for i, o := range rp.Outcomes {
		if o.Kind != Done || o.Tokens != 1 {
			t.Errorf("row %d: %+v", i, o)
		}
	}
}
