package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-dev/sluice/pkg/openai"
)

func sseServer(t *testing.T, handler func(w http.ResponseWriter, req openai.ChatRequest)) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		var req openai.ChatRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		handler(w, req)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestStreamParsesChunksAndUsage(t *testing.T) {
	srv := sseServer(t, func(w http.ResponseWriter, req openai.ChatRequest) {
		if !req.Stream || req.StreamOptions == nil || !req.StreamOptions.IncludeUsage || req.MaxTokens == nil || *req.MaxTokens != 7 || req.Model != "m" {
			t.Errorf("unexpected request %+v", req)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, ": keep-alive comment\n\n")
		fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`+"\n\n")
		for _, tok := range []string{"Hel", "lo", " world"} {
			fmt.Fprintf(w, `data: {"choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}]}`+"\n\n", tok)
		}
		fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
		fmt.Fprint(w, `data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	c, err := NewOpenAI(OpenAIOptions{Endpoints: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	res, err := c.Stream(context.Background(), Request{Model: "m", MaxTokens: 7, Messages: []openai.Message{openai.TextMessage("user", "hi")}},
		func(d Delta) error { got.WriteString(d.Text); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != "Hello world" || res.Chunks != 3 || res.FinishReason != "stop" || !res.UsageReported || res.Usage.TotalTokens != 8 {
		t.Fatalf("got %q, %+v", got.String(), res)
	}
}

func TestStreamErrorsClassified(t *testing.T) {
	for _, tc := range []struct {
		status    int
		retryable bool
	}{{400, false}, {404, false}, {429, true}, {503, true}} {
		srv := sseServer(t, func(w http.ResponseWriter, _ openai.ChatRequest) {
			http.Error(w, `{"error":{"message":"nope"}}`, tc.status)
		})
		c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{srv.URL + "/v1/"}})
		_, err := c.Stream(context.Background(), Request{Model: "m"}, func(Delta) error { return nil })
		var e *Error
		if !errors.As(err, &e) || e.Status != tc.status || IsRetryable(err) != tc.retryable {
			t.Errorf("status %d: err %v retryable %v", tc.status, err, IsRetryable(err))
		}
	}
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{"http://127.0.0.1:1"}})
	if _, err := c.Stream(context.Background(), Request{}, func(Delta) error { return nil }); !IsRetryable(err) {
		t.Errorf("connection refused should be retryable, got %v", err)
	}
}

func TestStreamWithoutFinishIsError(t *testing.T) {
	srv := sseServer(t, func(w http.ResponseWriter, _ openai.ChatRequest) {
		fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"content":"half"},"finish_reason":null}]}`+"\n\n")
	})
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{srv.URL}})
	res, err := c.Stream(context.Background(), Request{}, func(Delta) error { return nil })
	if err == nil || res.Chunks != 1 {
		t.Fatalf("truncated stream accepted: %+v %v", res, err)
	}
}

func TestOnDeltaErrorStops(t *testing.T) {
	srv := sseServer(t, func(w http.ResponseWriter, _ openai.ChatRequest) {
		for i := 0; i < 10; i++ {
			fmt.Fprintf(w, `data: {"choices":[{"index":0,"delta":{"content":"t%d"}}]}`+"\n\n", i)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{srv.URL}})
	stop := errors.New("stop")
	n := 0
	_, err := c.Stream(context.Background(), Request{}, func(Delta) error {
		n++
		if n == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 3 {
		t.Fatalf("err %v after %d deltas", err, n)
	}
}

func TestRoundRobin(t *testing.T) {
	var a, b atomic.Int32
	mk := func(n *atomic.Int32) *httptest.Server {
		return sseServer(t, func(w http.ResponseWriter, _ openai.ChatRequest) {
			n.Add(1)
			fmt.Fprint(w, `data: {"choices":[{"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
		})
	}
	sa, sb := mk(&a), mk(&b)
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{sa.URL, sb.URL}})
	for i := 0; i < 4; i++ {
		if _, err := c.Stream(context.Background(), Request{}, func(Delta) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if a.Load() != 2 || b.Load() != 2 {
		t.Fatalf("spread %d/%d, want 2/2", a.Load(), b.Load())
	}
}

// A client's messages and sampling parameters reach the backend as they
// came, and its tool-call pieces and model name come back.
func TestStreamForwardsAndReadsToolCalls(t *testing.T) {
	var body map[string]json.RawMessage
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Error(err)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"model":"m-2024","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]},"finish_reason":null}]}`+"\n\n")
		fmt.Fprint(w, `data: {"model":"m-2024","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":1}"}}]},"finish_reason":null}]}`+"\n\n")
		fmt.Fprint(w, `data: {"model":"m-2024","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	c, err := NewOpenAI(OpenAIOptions{Endpoints: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	var msg openai.Message
	if err := json.Unmarshal([]byte(`{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"}}],"x_extra":true}`), &msg); err != nil {
		t.Fatal(err)
	}
	temp := 0.3
	req := Request{Model: "m", Messages: []openai.Message{msg}, Sampling: openai.Sampling{
		Temperature: &temp, Stop: openai.Stop{"END"},
		Tools: []openai.Tool{{Type: "function", Function: openai.FunctionDef{Name: "f"}}},
	}}
	var calls []openai.ToolCall
	index := map[int]int{}
	res, err := c.Stream(context.Background(), req, func(d Delta) error {
		calls = openai.AddToolCalls(calls, index, d.ToolCalls)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(body["messages"]); got != `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"}}],"x_extra":true}]` {
		t.Errorf("messages sent as %s", got)
	}
	if string(body["temperature"]) != "0.3" || string(body["stop"]) != `["END"]` || !strings.Contains(string(body["tools"]), `"name":"f"`) {
		t.Errorf("sampling sent as temperature=%s stop=%s tools=%s", body["temperature"], body["stop"], body["tools"])
	}
	if _, ok := body["top_p"]; ok {
		t.Error("an unset parameter was sent")
	}
	if res.Model != "m-2024" || res.FinishReason != "tool_calls" || res.Chunks != 2 {
		t.Errorf("result %+v", res)
	}
	if len(calls) != 1 || calls[0].ID != "call_1" || calls[0].Function.Name != "f" || calls[0].Function.Arguments != `{"a":1}` {
		t.Errorf("tool calls %+v", calls)
	}
}
