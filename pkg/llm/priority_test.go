package llm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/request"
)

// bodyRecorder is a backend that answers every stream with one token and
// keeps each request's body as it came.
func bodyRecorder(t *testing.T) (*httptest.Server, func() []map[string]json.RawMessage) {
	t.Helper()
	var mu sync.Mutex
	var bodies []map[string]json.RawMessage
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]json.RawMessage
		if err := json.Unmarshal(raw, &body); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		mu.Lock()
		bodies = append(bodies, body)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":null}]}`+"\n\n")
		fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv, func() []map[string]json.RawMessage {
		mu.Lock()
		defer mu.Unlock()
		return append([]map[string]json.RawMessage(nil), bodies...)
	}
}

func TestPriorityOfClasses(t *testing.T) {
	for class, want := range map[string]int{
		request.ClassPriority: -1, request.ClassDefault: 0, request.ClassFlex: 1, "": 0, "scale": 0,
	} {
		if got := PriorityOf(class); got != want {
			t.Errorf("PriorityOf(%q) = %d, want %d", class, got, want)
		}
	}
}

// A pool whose backend takes a priority is sent the request's, the
// default class's 0 included, on a continuation too; a pool that does
// not say so is never sent one.
func TestPrioritySentOnlyWhereTheBackendTakesIt(t *testing.T) {
	cases := []struct {
		name     string
		option   string
		priority int
		resume   bool
		want     string // "" for no priority field
	}{
		{"vllm, priority class", PriorityVLLM, PriorityOf(request.ClassPriority), false, "-1"},
		{"vllm, default class", PriorityVLLM, PriorityOf(request.ClassDefault), false, "0"},
		{"vllm, flex continued", PriorityVLLM, PriorityOf(request.ClassFlex), true, "1"},
		{"none", PriorityNone, PriorityOf(request.ClassPriority), false, ""},
		{"unset", "", PriorityOf(request.ClassFlex), false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv, bodies := bodyRecorder(t)
			c, err := NewOpenAI(OpenAIOptions{Endpoints: []string{srv.URL}, Priority: tc.option, Continuation: ContinuationVLLM})
			if err != nil {
				t.Fatal(err)
			}
			req := Request{Model: "m", Messages: []openai.Message{openai.TextMessage("user", "hi")}, Priority: tc.priority}
			if tc.resume {
				req.Resume = &Resume{Text: "so far", Pieces: 2}
			}
			if _, err := c.Stream(context.Background(), req, func(Delta) error { return nil }); err != nil {
				t.Fatal(err)
			}
			got := bodies()
			if len(got) != 1 {
				t.Fatalf("%d requests", len(got))
			}
			p, sent := got[0]["priority"]
			if (tc.want == "") == sent || (sent && string(p) != tc.want) {
				t.Fatalf("priority %s (sent %v), want %q", p, sent, tc.want)
			}
			if _, cont := got[0]["continue_final_message"]; cont != tc.resume {
				t.Fatalf("continue_final_message sent %v, want %v", cont, tc.resume)
			}
		})
	}
	if _, err := NewOpenAI(OpenAIOptions{Endpoints: []string{"http://x"}, Priority: "sglang"}); err == nil {
		t.Fatal("an unknown priority kind is accepted")
	}
}
