package activities_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/request"
)

// A stream of a request's service class is sent to the simulator with
// the class's vLLM priority when its pool's backend takes one, and with
// none otherwise.
func TestStreamLLMSendsTheClassPriorityWhereTaken(t *testing.T) {
	sim, _ := simulator(t, nil)
	var mu sync.Mutex
	var sent []json.RawMessage
	// A recorder in front of the real simulator: it answers every stream.
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]json.RawMessage
		_ = json.Unmarshal(raw, &body)
		mu.Lock()
		sent = append(sent, body["priority"])
		mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(raw))
		sim.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	for i, tc := range []struct {
		option, class, want string
	}{
		{llm.PriorityVLLM, request.ClassPriority, "-1"},
		{llm.PriorityVLLM, request.ClassFlex, "1"},
		{llm.PriorityVLLM, "", "0"},
		{llm.PriorityNone, request.ClassPriority, ""},
	} {
		client, err := llm.NewOpenAI(llm.OpenAIOptions{Name: request.PoolShort, Endpoints: []string{front.URL}, Priority: tc.option})
		if err != nil {
			t.Fatal(err)
		}
		h := newHarness(t, func(o *harnessOptions) { o.streamer = client })
		id := "p" + string(rune('0'+i))
		version, hits := h.retrieveContext(t, id, 10, 3)
		in := activities.LLMInput{RequestID: id, Pool: request.PoolShort, Query: query, KB: kbName, KBVersion: version, Context: hits,
			MaxTokens: 5, ServiceTier: tc.class}
		if _, err := stream(t, h, in, nil); err != nil {
			t.Fatalf("%s/%q: %v", tc.option, tc.class, err)
		}
		mu.Lock()
		got := sent[len(sent)-1]
		mu.Unlock()
		if string(got) != tc.want {
			t.Errorf("%s, class %q: priority %s, want %q", tc.option, tc.class, got, tc.want)
		}
	}
}
