package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/worker"
)

// fallbackStack is a second API process (with its embedded worker) on the
// package's Temporal server and Redis, its own task queue and key
// prefix, whose pools are two simulators: the short pool's model
// "sim-small" has a context of 64 tokens, the long pool's "sim-large"
// the default, and the short pool falls back to the long one.
type fallbackStack struct {
	url  string
	gate *admission.Gate
}

func startFallbackStack(t *testing.T) fallbackStack {
	t.Helper()
	serve := func(model string, maxModelLen int) string {
		c := llmsim.DefaultConfig()
		c.Model, c.MaxModelLen, c.TimeScale = model, maxModelLen, 0.1
		sim, err := llmsim.New(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(sim.Handler())
		t.Cleanup(func() {
			srv.Close()
			sim.Close()
		})
		return srv.URL
	}
	cfg := stack.cfg
	cfg.Temporal.TaskQueue = "sluice-fallback"
	cfg.Redis.KeyPrefix = "itfb:"
	cfg.Metrics.Addr = "" // the package stack's API holds its port
	cfg.Pools.Shared.MaxConcurrency = 0
	cfg.Pools.Short.Endpoints, cfg.Pools.Short.Model = []string{serve("sim-small", 64)}, "sim-small"
	cfg.Pools.Long.Endpoints, cfg.Pools.Long.Model = []string{serve("sim-large", 0)}, "sim-large"
	cfg.Pools.Short.Fallbacks = []config.Fallback{{Pool: request.PoolLong}}
	// Room in the short pool's bound for a question its model cannot take.
	cfg.Retrieval.TopK = 1
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api, err := app.StartAPI(ctx, cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := api.Stop(20 * time.Second); err != nil {
			t.Error(err)
		}
	})
	gopts := worker.GateOptions(cfg)
	gopts.KeyPrefix = cfg.Redis.KeyPrefix
	gate, err := admission.New(stack.redis, gopts)
	if err != nil {
		t.Fatal(err)
	}
	return fallbackStack{url: api.URL, gate: gate}
}

// wordy is a question routed to the short pool (its bound, with a full context, under 512
// tokens) that the short pool's model cannot take (over its 64).
var wordy = "Explain, step by step, " + strings.Repeat("how a leased permit, a fair queue and a circuit breaker keep a gateway standing, ", 4) + "in one paragraph."

// A prompt that the short pool's backend refuses as beyond its model's
// context is answered by the long pool's model, through the native and
// the OpenAI API: the answer's model names it, its done event (or
// extension) and the workflow's result say why, and every permit of both
// pools is given back.
func TestFallbackAnswersFromTheLongPool(t *testing.T) {
	fs := startFallbackStack(t)
	want := events.Fallback{From: "sim-small", To: "sim-large", FromPool: request.PoolShort, ToPool: request.PoolLong, Reason: request.FallbackContextTooLong}

	body, _ := json.Marshal(map[string]any{"query": wordy, "max_tokens": 24})
	resp := postTo(t, fs.url+"/v1/chat", body)
	id := resp.Header.Get("X-Request-ID")
	var done events.Done
	r := testenv.NewSSEReader(resp.Body)
	for {
		ev, err := r.Next()
		if err != nil {
			t.Fatalf("stream ended before its end: %v", err)
		}
		if !events.Terminal(ev.Event) {
			continue
		}
		if ev.Event != events.TypeDone {
			t.Fatalf("the request ended with %s: %s", ev.Event, ev.Data)
		}
		if err := ev.Decode(&done); err != nil {
			t.Fatal(err)
		}
		break
	}
	resp.Body.Close()
	if done.Model != "sim-large" || done.Route != request.PoolLong || done.Fallback == nil || *done.Fallback != want {
		t.Fatalf("done: model %q route %q fallback %+v, want sim-large in long after %+v", done.Model, done.Route, done.Fallback, want)
	}
	if res := result(t, id); res.Fallback == nil || *res.Fallback != want || res.Route != request.PoolLong {
		t.Fatalf("workflow result %+v, want the fallback %+v", res, want)
	}
	recordHistory(t, id, "chat_fallback")

	body, _ = json.Marshal(map[string]any{"model": "sim-small", "max_tokens": 24,
		"messages": []map[string]string{{"role": "user", "content": wordy}}})
	resp = postTo(t, fs.url+"/v1/chat/completions", body)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var completion struct {
		Model  string `json:"model"`
		Sluice struct {
			Route    string           `json:"route"`
			Fallback *events.Fallback `json:"fallback"`
		} `json:"sluice"`
	}
	if err := json.Unmarshal(raw, &completion); err != nil {
		t.Fatalf("completion %s: %v", raw, err)
	}
	if completion.Model != "sim-large" || completion.Sluice.Fallback == nil || *completion.Sluice.Fallback != want {
		t.Fatalf("completion %s, want model sim-large after %+v", raw, want)
	}

	for _, pool := range request.Pools() {
		st, err := fs.gate.Stats(context.Background(), pool)
		if err != nil {
			t.Fatal(err)
		}
		if st.InUse != 0 || st.Waiting != 0 {
			t.Fatalf("pool %s not idle after the fallbacks: %+v", pool, st)
		}
	}
}

// postTo sends body to url as the acme key and fails the test on any
// answer but 200.
func postTo(t *testing.T, url string, body []byte) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer k-acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, b)
	}
	return resp
}
