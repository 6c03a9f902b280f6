package vtc

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

// A Replay sends a workload's rows at their arrival times, Speed times
// faster than the trace, each as an OpenAI streaming chat completion to
// an endpoint (Sluice's /v1/chat/completions in gateway mode with the
// row's client's key, or the simulator's own), and records when each
// token came. Nothing is retried: a row is one request, as in the paper.

// Target is where a replay sends: the chat completions URLs (row i goes
// to URLs[i mod len(URLs)], so that with two a client's requests take
// both), and the headers of each row (nil: none).
type Target struct {
	System  string
	URLs    []string
	Client  *http.Client
	Headers func(r Row) map[string]string
}

// Outcome is one request's end as its client saw it.
type Outcome struct {
	// Kind: done, cut (its stream was still open at the end of the
	// replay), or what failed it.
	Kind string
	// Route is the pool Sluice answered from ("": none said).
	Route string
	// Tokens and the times of the first and last, in trace seconds.
	Tokens      int
	First, Last float64
	// The backend's usage, when the stream gave it.
	PromptUsage, OutputUsage int
	HasUsage                 bool
}

// Outcome kinds besides failures ("error <code>", "HTTP <status>").
const (
	Done = "done"
	Cut  = "cut"
)

// Replay is one workload's run against one target.
type Replay struct {
	Target Target
	Rows   []Row
	Bodies [][]byte
	Speed  float64
	// Until is the trace time after which open streams are cut.
	Until float64

	t0 time.Time
	// Outcomes are the rows' ends, once Run returned.
	Outcomes []Outcome
	// For the progress line.
	sent, streaming, ended atomic.Int64
}

// ChatBody is a row's request: one user message, its output bound (none
// when maxTokens is 0), a stream with usage. model is a model the pools
// serve, so that Sluice takes it in gateway mode (no retrieval, the
// message forwarded as is).
func ChatBody(model, message string, maxTokens int) []byte {
	body := map[string]any{
		"model": model, "messages": []map[string]string{{"role": "user", "content": message}},
		"stream": true, "stream_options": map[string]bool{"include_usage": true},
	}
	if maxTokens > 0 {
		body["max_tokens"] = maxTokens
	}
	b, _ := json.Marshal(body)
	return b
}

// TraceNow is the trace time now.
func (rp *Replay) TraceNow() float64 { return time.Since(rp.t0).Seconds() * rp.Speed }

// Started is when Begin started the clock.
func (rp *Replay) Started() time.Time { return rp.t0 }

// wallAt is when trace time t is.
func (rp *Replay) wallAt(t float64) time.Time {
	return rp.t0.Add(time.Duration(t / rp.Speed * float64(time.Second)))
}

// Begin starts the replay's clock; Status may be called after it.
func (rp *Replay) Begin() { rp.t0 = time.Now() }

// Run sends every row at its time (from Begin), then waits until every
// request ended or trace time Until, and cuts the ones still open.
func (rp *Replay) Run(ctx context.Context) {
	rp.Outcomes = make([]Outcome, len(rp.Rows))
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i, r := range rp.Rows {
		if !sleepUntil(rctx, rp.wallAt(r.Arrival)) {
			break
		}
		rp.sent.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rp.Outcomes[i] = rp.send(rctx, i)
			rp.ended.Add(1)
		}()
	}
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(time.Until(rp.wallAt(rp.Until))):
	case <-ctx.Done():
	}
	cancel()
	<-all
}

// sleepUntil waits until t; false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(time.Until(t)):
		return ctx.Err() == nil
	}
}

// send sends row i and reads its stream to its end.
func (rp *Replay) send(ctx context.Context, i int) Outcome {
	url := rp.Target.URLs[i%len(rp.Target.URLs)]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(rp.Bodies[i]))
	if err != nil {
		return Outcome{Kind: "error " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	if rp.Target.Headers != nil {
		for k, v := range rp.Target.Headers(rp.Rows[i]) {
			req.Header.Set(k, v)
		}
	}
	resp, err := rp.Target.Client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return Outcome{Kind: Cut}
		}
		return Outcome{Kind: "transport error"}
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
		return Outcome{Kind: strings.TrimSpace(fmt.Sprintf("HTTP %d %s", resp.StatusCode, e.Error.Code))}
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
func (rp *Replay) read(ctx context.Context, body io.Reader) Outcome {
	var out Outcome
	br := bufio.NewReaderSize(body, 16<<10)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			out.Kind = "stream ended without [DONE]"
			if ctx.Err() != nil {
				out.Kind = Cut
			}
			return out
		}
		data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			out.Kind = Done
			return out
		}
		var ch streamChunk
		if json.Unmarshal(data, &ch) != nil {
			continue
		}
		if ch.Error != nil {
			out.Kind = "error " + ch.Error.Code
			return out
		}
		rp.account(&out, ch)
	}
}

// account adds a chunk to what the request got.
func (rp *Replay) account(out *Outcome, ch streamChunk) {
	if ch.Usage != nil {
		out.PromptUsage, out.OutputUsage, out.HasUsage = ch.Usage.PromptTokens, ch.Usage.CompletionTokens, true
	}
	if ch.Sluice != nil {
		out.Route = ch.Sluice.Route
	}
	if len(ch.Choices) == 0 {
		return
	}
	c := ch.Choices[0]
	if c.FinishReason != nil || c.Delta.Content == nil || *c.Delta.Content == "" {
		return
	}
	now := rp.TraceNow()
	if out.Tokens == 0 {
		out.First = now
		rp.streaming.Add(1)
	}
	out.Tokens++
	out.Last = now
}

// Reqs are the replay's requests for the metrics: each row's recorded
// lengths as its demand, and what it was served. A request cut at the
// end is counted with the tokens it got by then.
func (rp *Replay) Reqs(promptCounts []int) []Req {
	reqs := make([]Req, len(rp.Rows))
	for i, r := range rp.Rows {
		o := rp.Outcomes[i]
		q := Req{Client: r.Client, Arrival: r.Arrival, Prompt: r.Prompt, Output: r.Output}
		if o.Tokens > 0 {
			q.Served, q.First, q.Last = true, o.First, o.Last
			q.GotPrompt, q.GotOutput = promptCounts[i], o.Tokens
			if o.HasUsage {
				q.GotPrompt, q.GotOutput = o.PromptUsage, o.OutputUsage
			}
		}
		reqs[i] = q
	}
	return reqs
}

// Status is the replay's progress line.
func (rp *Replay) Status() string {
	at := rp.TraceNow()
	sent, ended := rp.sent.Load(), rp.ended.Load()
	return fmt.Sprintf("system=%s trace=%.0fs/%.0fs sent=%d/%d answering_or_done=%d ended=%d open=%d",
		rp.Target.System, at, rp.Until, sent, len(rp.Rows), rp.streaming.Load(), ended, sent-ended)
}
