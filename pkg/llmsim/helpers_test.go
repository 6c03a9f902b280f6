package llmsim_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/llmsim"
)

// testConfig runs fifty times faster than real time; tests compare
// orderings and ratios, never absolute durations.
func testConfig() llmsim.Config {
	cfg := llmsim.DefaultConfig()
	cfg.TimeScale = 0.02
	return cfg
}

type testSim struct {
	*llmsim.Server
	url    string
	client *http.Client
}

func start(t *testing.T, cfg llmsim.Config) *testSim {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	sim, err := llmsim.New(cfg, logger)
	if err != nil {
		t.Fatalf("start simulator: %v", err)
	}
	ts := httptest.NewServer(sim.Handler())
	// Cleanups run last-in first-out: the simulator aborts what is still in
	// flight, then the HTTP server waits for its handlers.
	t.Cleanup(ts.Close)
	t.Cleanup(sim.Close)
	return &testSim{Server: sim, url: ts.URL, client: ts.Client()}
}

func userMsg(text string) []map[string]any {
	return []map[string]any{{"role": "user", "content": text}}
}

type sseChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
	} `json:"error"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type chatResult struct {
	Text    string
	Chunks  int // chunks that carried content
	Finish  string
	Usage   usage
	Latency time.Duration
}

func post(ctx context.Context, c *http.Client, url string, body any) (*http.Response, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	return c.Do(req)
}

// readSSE returns the data payloads of an event stream, in order.
func readSSE(r io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			out = append(out, data)
		} else if line != "" {
			return out, fmt.Errorf("unexpected SSE line %q", line)
		}
	}
	return out, sc.Err()
}

// streamChat runs a streaming completion with include_usage and checks the
// framing loosely; TestStreamFormat checks it exactly. It is safe to call
// from any goroutine (it returns errors instead of failing the test).
func (s *testSim) streamChat(ctx context.Context, body map[string]any) (chatResult, error) {
	body["stream"] = true
	body["stream_options"] = map[string]any{"include_usage": true}
	began := time.Now()
	resp, err := post(ctx, s.client, s.url+"/v1/chat/completions", body)
	if err != nil {
		return chatResult{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return chatResult{}, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	payloads, err := readSSE(resp.Body)
	if err != nil {
		return chatResult{}, err
	}
	var res chatResult
	if len(payloads) == 0 || payloads[len(payloads)-1] != "[DONE]" {
		return res, fmt.Errorf("stream did not end with [DONE]: %q", payloads)
	}
	for _, p := range payloads[:len(payloads)-1] {
		var c sseChunk
		if err := json.Unmarshal([]byte(p), &c); err != nil {
			return res, fmt.Errorf("decode chunk %q: %w", p, err)
		}
		if c.Error != nil {
			return res, fmt.Errorf("stream error: %s", c.Error.Message)
		}
		if len(c.Choices) == 0 {
			if c.Usage == nil {
				return res, fmt.Errorf("chunk without choices or usage: %q", p)
			}
			res.Usage = *c.Usage
			continue
		}
		ch := c.Choices[0]
		if ch.FinishReason != nil {
			res.Finish = *ch.FinishReason
		}
		if ch.Delta.Content != nil && ch.Delta.Role == "" {
			res.Text += *ch.Delta.Content
			res.Chunks++
		}
	}
	res.Latency = time.Since(began)
	return res, nil
}

// chat runs a non-streaming completion.
func (s *testSim) chat(ctx context.Context, body map[string]any) (chatResult, error) {
	resp, err := post(ctx, s.client, s.url+"/v1/chat/completions", body)
	if err != nil {
		return chatResult{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return chatResult{}, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	var out struct {
		Choices []struct {
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return chatResult{}, fmt.Errorf("decode completion: %w", err)
	}
	if len(out.Choices) != 1 {
		return chatResult{}, fmt.Errorf("want 1 choice, got %d", len(out.Choices))
	}
	return chatResult{Text: out.Choices[0].Message.Content, Finish: out.Choices[0].FinishReason, Usage: out.Usage}, nil
}

// parallel runs n streaming completions at once and returns their results
// in order; body(i) builds request i.
func (s *testSim) parallel(ctx context.Context, n int, body func(i int) map[string]any) ([]chatResult, error) {
	results := make([]chatResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i], errs[i] = s.streamChat(ctx, body(i)) })
	}
	wg.Wait()
	return results, errors.Join(errs...)
}

// waitFor polls Stats until cond holds. The timeout is only there to turn a
// hang into a failure; it is far above what any test needs.
func (s *testSim) waitFor(t *testing.T, what string, cond func(llmsim.Stats) bool) llmsim.Stats {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := s.Stats()
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last stats %+v", what, st)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// monitor samples Stats until stop is closed.
func (s *testSim) monitor(stop <-chan struct{}) <-chan []llmsim.Stats {
	out := make(chan []llmsim.Stats, 1)
	go func() {
		var samples []llmsim.Stats
		for {
			samples = append(samples, s.Stats())
			select {
			case <-stop:
				out <- samples
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	return out
}

func mean(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// scrape fetches /metrics as a map from "name{labels}" to value.
func (s *testSim) scrape(t *testing.T) (map[string]float64, string) {
	t.Helper()
	resp, err := s.client.Get(s.url + "/metrics")
	if err != nil {
		t.Fatalf("get metrics: %v", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read metrics: %v", err)
	}
	vals := map[string]float64{}
	for line := range strings.Lines(string(raw)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		var v float64
		if _, err := fmt.Sscan(line[i+1:], &v); err != nil {
			t.Fatalf("parse metric line %q: %v", line, err)
		}
		vals[line[:i]] = v
	}
	return vals, string(raw)
}
