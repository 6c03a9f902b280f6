package fairness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/tests/load/internal/chat"
	"github.com/sluice-dev/sluice/tests/load/internal/load"
	"github.com/sluice-dev/sluice/tests/load/internal/slo"
	"github.com/sluice-dev/sluice/tests/load/internal/stack"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// sloStep is one mode under one load, as measured.
type sloStep struct {
	mode       string
	mult, rate float64
	// seed is what the step's arrivals and lengths are drawn with; run
	// is which of the -seeds runs of this load it is (0-based).
	seed   uint64
	run    int
	window time.Duration
	// all is every arrival of the step, warm-up included (their answers
	// stream into the window); the window's are marked inWindow.
	all []*sloArrival
	// samples are the looks at Sluice's queue within the window (none
	// for FCFS).
	samples []backlogSample
}

func (s *sloStep) label() string { return fmt.Sprintf("%s %g× seed %d", s.mode, s.mult, s.seed) }

// sloArrival is one arrival as its client saw it. Its result's ttft and
// last run from the scheduled arrival, not from the send, so that a
// generator running late does not hide its lateness.
type sloArrival struct {
	tier int
	// tokens is the answer's length, drawn for it.
	tokens   int
	at       time.Time
	inWindow bool
	// dropped: the generator had -max-in-flight requests out and did not
	// send it.
	dropped bool
	res     chat.Result
	// took runs from the arrival to the outcome.
	took time.Duration
}

// backlogSample is one look at the queue: which tiers had a request
// waiting for a permit (the pools bench's "backlogged").
type backlogSample struct {
	at      time.Time
	waiting [len(slo.Tiers)]bool
}

// sloRun is one step's load while it runs.
type sloRun struct {
	label            string
	start            time.Time
	winStart, winEnd time.Time
	timeout          time.Duration

	mu      sync.Mutex
	all     []*sloArrival
	samples []backlogSample

	inFlight, ended, dropped atomic.Int64
}

func newSLORun(label string, warmup, window, timeout time.Duration) *sloRun {
	start := time.Now()
	return &sloRun{label: label, start: start, winStart: start.Add(warmup), winEnd: start.Add(warmup + window), timeout: timeout}
}

// openLoop sends Poisson arrivals of rate per second until the window is
// over, each interactive with probability share and its answer's length
// drawn from w, and waits for every one to end. Times and tiers come
// from one seeded generator, lengths from another, drawn whether or not
// an arrival is sent, so every mode gets the same arrivals.
func (r *sloRun) openLoop(ctx context.Context, rate, share float64, w sloWorkload, maxInFlight int, seed uint64, do sloRequester) {
	rng, lengths := rand.New(rand.NewPCG(seed, seed)), lengthRNG(seed)
	var wg sync.WaitGroup
	at := r.start
	for i := 0; ; i++ {
		at = at.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		tier := slo.Batch
		if rng.Float64() < share {
			tier = slo.Interactive
		}
		tokens := w.draw(lengths)
		if !at.Before(r.winEnd) || !load.SleepUntil(ctx, at) {
			break
		}
		a := &sloArrival{tier: tier, tokens: tokens, at: at, inWindow: !at.Before(r.winStart)}
		r.mu.Lock()
		r.all = append(r.all, a)
		r.mu.Unlock()
		if r.inFlight.Load() >= int64(maxInFlight) {
			a.dropped = true
			r.dropped.Add(1)
			continue
		}
		r.inFlight.Add(1)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r.send(ctx, do, a, i)
		}(i)
	}
	wg.Wait()
}

// send sends one arrival with its client's patience, counted from the
// arrival.
func (r *sloRun) send(ctx context.Context, do sloRequester, a *sloArrival, i int) {
	cctx, cancel := context.WithDeadline(ctx, a.at.Add(r.timeout))
	defer cancel()
	lag := time.Since(a.at)
	res := do(cctx, a.tier, i, a.tokens)
	if res.Tokens > 0 {
		res.TTFT += lag
		res.Last += lag
	}
	a.res, a.took = res, time.Since(a.at)
	r.inFlight.Add(-1)
	r.ended.Add(1)
}

// sampleQueues looks at every pool's queue each interval within the
// window: a tier is backlogged when its tenant has a request waiting.
// Requests waiting at the door's waiting room (before their workflow
// starts) are not in it.
func (r *sloRun) sampleQueues(ctx context.Context, st *stack.Stack, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	tiers := map[string]int{}
	for i := range slo.Tiers {
		tiers[sloTenant(i)] = i
	}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if now.Before(r.winStart) {
				continue
			}
			s := backlogSample{at: now}
			for _, pool := range st.Core.Gate.Pools() {
				qs, err := st.Core.Gate.QueueStats(ctx, pool)
				if err != nil {
					continue
				}
				for tenant, n := range qs.ByTenant {
					if i, ok := tiers[tenant]; ok && n > 0 {
						s.waiting[i] = true
					}
				}
			}
			r.mu.Lock()
			r.samples = append(r.samples, s)
			r.mu.Unlock()
		}
	}
}

func (r *sloRun) samplesTaken() []backlogSample {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]backlogSample(nil), r.samples...)
}

// status is the step's progress line.
func (r *sloRun) status() string {
	phase := "warm-up"
	switch now := time.Now(); {
	case now.After(r.winEnd):
		phase = "draining"
	case now.After(r.winStart):
		phase = "measuring"
	}
	r.mu.Lock()
	arrivals := len(r.all)
	r.mu.Unlock()
	return fmt.Sprintf("step=%q phase=%s at=%.0fs/%.0fs arrivals=%d ended=%d in_flight=%d dropped=%d",
		r.label, phase, time.Since(r.start).Seconds(), r.winEnd.Sub(r.start).Seconds(), arrivals, r.ended.Load(), r.inFlight.Load(), r.dropped.Load())
}

// fcfsBody is the streamed chat completion the FCFS clients post: the
// prompt Sluice builds, with the usage chunk asked for.
func fcfsBody(model string, msgs []openai.Message, maxTokens int) ([]byte, error) {
	return json.Marshal(map[string]any{
		"model": model, "messages": msgs, "max_tokens": maxTokens, "stream": true,
		"stream_options": map[string]bool{"include_usage": true},
	})
}

// fcfsChat posts one completion straight to the simulator and reads its
// stream to [DONE], as chat.Read reads Sluice's: the kinds are the same
// (done, hang, HTTP <status>, and what went wrong otherwise). It also
// returns the prompt's tokens, from the usage chunk.
func fcfsChat(ctx context.Context, hc *http.Client, url string, body []byte) (chat.Result, int) {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return chat.Result{Kind: "error " + err.Error()}, 0
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	switch {
	case err != nil && ctx.Err() != nil:
		return chat.Result{Kind: chat.KindHang}, 0
	case err != nil:
		return chat.Result{Kind: "transport error"}, 0
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return chat.Result{Kind: fmt.Sprintf("HTTP %d", resp.StatusCode)}, 0
	}
	var r chat.Result
	prompt := 0
	sse := testenv.NewSSEReader(resp.Body)
	for {
		ev, err := sse.Next()
		switch {
		case err != nil && ctx.Err() != nil:
			r.Kind = chat.KindHang
			return r, prompt
		case err != nil:
			r.Kind = "stream ended without [DONE]"
			return r, prompt
		case ev.Data == "[DONE]":
			r.Kind = chat.KindDone
			if r.Tokens == 0 {
				r.Kind = "done without tokens"
			}
			return r, prompt
		case strings.HasPrefix(ev.Data, `{"error"`):
			r.Kind = "error backend"
			return r, prompt
		}
		var c openai.Chunk
		if json.Unmarshal([]byte(ev.Data), &c) != nil {
			r.Kind = "bad chunk"
			return r, prompt
		}
		if u := c.Usage.Value; u != nil {
			r.Served, r.Completion, prompt = u.PromptTokens+u.CompletionTokens, u.CompletionTokens, u.PromptTokens
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != nil && *ch.Delta.Content != "" {
				r.Last = time.Since(start)
				if r.Tokens == 0 {
					r.TTFT = r.Last
				}
				r.Tokens++
			}
		}
	}
}

// storeMax raises a to v if v is larger.
func storeMax(a *atomic.Int64, v int64) {
	for cur := a.Load(); v > cur; cur = a.Load() {
		if a.CompareAndSwap(cur, v) {
			return
		}
	}
}
