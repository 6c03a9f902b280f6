package integration

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/api/apispec/spectest"
	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/request"
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
	// The package stack's metered tier counts spend: its models need
	// prices. A copy, so that the package stack's map is not changed.
	cfg.Prices = maps.Clone(cfg.Prices)
	cfg.Prices["sim-small"], cfg.Prices["sim-large"] = itPrice, itPrice
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
	gopts := app.GateOptions(cfg)
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
// extension), the status and the workflow's result say why, every answer
// matches the OpenAPI description, and every permit of both pools is
// given back.
func TestFallbackAnswersFromTheLongPool(t *testing.T) {
	fs := startFallbackStack(t)
	spec, err := spectest.Load()
	if err != nil {
		t.Fatal(err)
	}
	c := &specClient{t: t, spec: spec, base: fs.url, called: map[string]bool{}}
	want := events.Fallback{From: "sim-small", To: "sim-large", FromPool: request.PoolShort, ToPool: request.PoolLong, Reason: request.FallbackContextTooLong}

	body, _ := json.Marshal(map[string]any{"query": wordy, "max_tokens": 24})
	ans := c.do(specCall{method: http.MethodPost, path: "/v1/chat", body: string(body), key: "k-acme"}, http.StatusOK)
	id := ans.resp.Header.Get("X-Request-ID")
	last := ans.events[len(ans.events)-1]
	var done events.Done
	if last.Event != events.TypeDone || last.Decode(&done) != nil {
		t.Fatalf("the request ended with %s: %s", last.Event, last.Data)
	}
	if done.Model != "sim-large" || done.Route != request.PoolLong || done.Fallback == nil || *done.Fallback != want {
		t.Fatalf("done: model %q route %q fallback %+v, want sim-large in long after %+v", done.Model, done.Route, done.Fallback, want)
	}
	if res := result(t, id); res.Fallback == nil || *res.Fallback != want || res.Route != request.PoolLong {
		t.Fatalf("workflow result %+v, want the fallback %+v", res, want)
	}
	var view struct {
		Status struct {
			Fallbacks []events.Fallback `json:"fallbacks"`
		} `json:"status"`
	}
	c.do(specCall{method: http.MethodGet, path: "/v1/requests/" + id, key: "k-acme"}, http.StatusOK).decode(t, &view)
	if len(view.Status.Fallbacks) != 1 || view.Status.Fallbacks[0] != want {
		t.Errorf("status fallbacks %+v, want [%+v]", view.Status.Fallbacks, want)
	}
	recordHistory(t, id, "chat_fallback")

	body, _ = json.Marshal(map[string]any{"model": "sim-small", "max_tokens": 24,
		"messages": []map[string]string{{"role": "user", "content": wordy}}})
	var completion struct {
		Model  string `json:"model"`
		Sluice struct {
			Fallback *events.Fallback `json:"fallback"`
		} `json:"sluice"`
	}
	ans = c.do(specCall{method: http.MethodPost, path: "/v1/chat/completions", body: string(body), key: "k-acme"}, http.StatusOK)
	ans.decode(t, &completion)
	if completion.Model != "sim-large" || completion.Sluice.Fallback == nil || *completion.Sluice.Fallback != want {
		t.Fatalf("completion %s, want model sim-large after %+v", ans.body, want)
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
