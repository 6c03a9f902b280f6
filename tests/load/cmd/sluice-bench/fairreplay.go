package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A replay sends a workload's rows at their arrival times, speed times
// faster than the trace, each as an OpenAI streaming chat completion to
// one endpoint (Sluice's /v1/chat/completions in gateway mode with the
// row's client's key, or the simulator's own), and records when each
// token came. Nothing is retried: a row is one request, as in the paper.

// replayTarget is where a replay sends: the chat completions URL, and
// the headers of each row (nil: none).
type replayTarget struct {
	system  string
	url     string
	hc      *http.Client
	headers func(r fairRow) map[string]string
}

// replayOutcome is one request's end as its client saw it.
type replayOutcome struct {
	// kind: done, cut (its stream was still open at the end of the
	// replay), or what failed it.
	kind string
	// route is the pool Sluice answered from ("": none said).
	route string
	// tokens and the times of the first and last, in trace seconds.
	tokens      int
	first, last float64
	// usage is the backend's, when the stream gave it.
	promptUsage, outputUsage int
	hasUsage                 bool
}

// Outcome kinds besides failures ("error <code>", "HTTP <status>").
const (
	replayDone = "done"
	replayCut  = "cut"
)

// replay is one workload's run against one target.
type replay struct {
	target replayTarget
	rows   []fairRow
	bodies [][]byte
	speed  float64
	// until is the trace time after which open streams are cut.
	until float64

	t0       time.Time
	outcomes []replayOutcome
	// For the progress line.
	sent, streaming, ended atomic.Int64
}

// chatBody is a row's request: one user message, its output bound, a
// stream with usage. model is a model the pools serve, so that Sluice
// takes it in gateway mode (no retrieval, the message forwarded as is).
func chatBody(model, message string, maxTokens int) []byte {
	b, _ := json.Marshal(map[string]any{
		"model": model, "messages": []map[string]string{{"role": "user", "content": message}},
		"max_tokens": maxTokens, "stream": true, "stream_options": map[string]bool{"include_usage": true},
	})
	return b
}

// traceNow is the trace time now.
func (rp *replay) traceNow() float64 { return time.Since(rp.t0).Seconds() * rp.speed }

// wallAt is when trace time t is.
func (rp *replay) wallAt(t float64) time.Time {
	return rp.t0.Add(time.Duration(t / rp.speed * float64(time.Second)))
}

// begin starts the replay's clock; status may be called after it.
func (rp *replay) begin() { rp.t0 = time.Now() }

// run sends every row at its time (from begin), then waits until every request ended
// or trace time until, and cuts the ones still open.
func (rp *replay) run(ctx context.Context) {
	rp.outcomes = make([]replayOutcome, len(rp.rows))
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i, r := range rp.rows {
		if !sleepUntil(rctx, rp.wallAt(r.arrival)) {
			break
		}
		rp.sent.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rp.outcomes[i] = rp.send(rctx, i)
			rp.ended.Add(1)
		}()
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(time.Until(rp.wallAt(rp.until))):
	case <-ctx.Done():
	}
	cancel()
	<-all
}

// send sends row i and reads its stream to its end.
func (rp *replay) send(ctx context.Context, i int) replayOutcome {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rp.target.url, bytes.NewReader(rp.bodies[i]))
	if err != nil {
		return replayOutcome{kind: "error " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	if rp.target.headers != nil {
		for k, v := range rp.target.headers(rp.rows[i]) {
			req.Header.Set(k, v)
		}
	}
	resp, err := rp.target.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return replayOutcome{kind: replayCut}
		}
		return replayOutcome{kind: "transport error"}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(raw, &e)
		return replayOutcome{kind: strings.TrimSpace(fmt.Sprintf("HTTP %d %s", resp.StatusCode, e.Error.Code))}
	}
	return rp.read(ctx, resp.Body)
}

// streamChunk is what a replay reads of an OpenAI chunk.
type streamChunk struct {
	Choices []struct {
		Delta struct {
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Code string `json:"code"`
	} `json:"error"`
	Sluice *struct {
		Route string `json:"route"`
	} `json:"sluice"`
}

// read reads an OpenAI event stream: a chunk with text is a token; SSE
// comments (Sluice's queue and stage news) are skipped.
func (rp *replay) read(ctx context.Context, body io.Reader) replayOutcome {
	var out replayOutcome
	br := bufio.NewReaderSize(body, 16<<10)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			out.kind = "stream ended without [DONE]"
			if ctx.Err() != nil {
				out.kind = replayCut
			}
			return out
		}
		data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			out.kind = replayDone
			return out
		}
		var ch streamChunk
		if json.Unmarshal(data, &ch) != nil {
			continue
		}
		if ch.Error != nil {
			out.kind = "error " + ch.Error.Code
			return out
		}
		rp.account(&out, ch)
	}
}

// account adds a chunk to what the request got.
func (rp *replay) account(out *replayOutcome, ch streamChunk) {
	if ch.Usage != nil {
		out.promptUsage, out.outputUsage, out.hasUsage = ch.Usage.PromptTokens, ch.Usage.CompletionTokens, true
	}
	if ch.Sluice != nil {
		out.route = ch.Sluice.Route
	}
	if len(ch.Choices) == 0 {
		return
	}
	c := ch.Choices[0]
	if c.FinishReason != nil || c.Delta.Content == nil || *c.Delta.Content == "" {
		return
	}
	now := rp.traceNow()
	if out.tokens == 0 {
		out.first = now
		rp.streaming.Add(1)
	}
	out.tokens++
	out.last = now
}

// fairReqs are the replay's requests for the metrics: each row's
// recorded lengths as its demand, and what it was served. A request cut
// at the end is counted with the tokens it got by then.
func (rp *replay) fairReqs(promptCounts []int) []fairReq {
	reqs := make([]fairReq, len(rp.rows))
	for i, r := range rp.rows {
		o := rp.outcomes[i]
		q := fairReq{client: r.client, arrival: r.arrival, prompt: r.prompt, output: r.output}
		if o.tokens > 0 {
			q.served, q.first, q.last = true, o.first, o.last
			q.gotPrompt, q.gotOutput = promptCounts[i], o.tokens
			if o.hasUsage {
				q.gotPrompt, q.gotOutput = o.promptUsage, o.outputUsage
			}
		}
		reqs[i] = q
	}
	return reqs
}

// status is the replay's progress line.
func (rp *replay) status() string {
	at := rp.traceNow()
	sent, ended := rp.sent.Load(), rp.ended.Load()
	return fmt.Sprintf("system=%s trace=%.0fs/%.0fs sent=%d/%d answering_or_done=%d ended=%d open=%d",
		rp.target.system, at, rp.until, sent, len(rp.rows), rp.streaming.Load(), ended, sent-ended)
}
