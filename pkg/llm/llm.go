// Package llm talks to LLM backends through the OpenAI-compatible chat
// completions API (vLLM, TGI, Ollama, llama.cpp and OpenAI all serve it),
// streaming the answer as it is generated.
package llm

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluice-dev/sluice/pkg/openai"
)

// Request is one chat completion.
type Request struct {
	Model string
	// Messages are sent as they are: a client's message keeps every field
	// it came with.
	Messages  []openai.Message
	MaxTokens int
	// Sampling is forwarded as it is; the zero value sends none of it.
	Sampling openai.Sampling
	// Choices is how many answers to generate (OpenAI's n); 0 or 1 asks
	// for one and sends no n.
	Choices int
	// Resume, if set, is the start of the answer that the caller already
	// has (from an earlier stream, lost with its worker): the stream
	// continues it as a failover does, on a pool whose backend can.
	Resume *Resume
	// Priority is the request's urgency as vLLM counts it (PriorityOf
	// its service class: lower is sooner, 0 the default class's), sent
	// only to a pool whose backend takes it (OpenAIOptions.Priority).
	Priority int
	// sendPriority is Priority when the backend takes it (withPriority).
	sendPriority *int
}

// Resume is an answer's start: its text, and the pieces of content it
// came in.
type Resume struct {
	Text   string
	Pieces int
}

// Delta is one piece of the answer: text, or pieces of the tool calls
// the model asks for.
type Delta struct {
	Text      string
	ToolCalls []openai.ToolCallDelta
	// Model is the model that answers, as the backend names it; set on
	// the first delta only.
	Model string
	// Choice is the answer the delta belongs to when several were asked
	// for (0 otherwise).
	Choice int
}

// Usage is what the backend reports it used.
type Usage = openai.Usage

// Result summarises a finished stream.
type Result struct {
	// Usage as reported by the backend, if UsageReported.
	Usage         Usage
	UsageReported bool
	// Chunks is the number of non-empty deltas streamed.
	Chunks int
	// FinishReason is the first choice's; Finishes every choice's, by
	// index, when several were asked for.
	FinishReason string
	Finishes     []string
	Endpoint     string
	// Model is the model that answered, as the backend named it in its
	// chunks; "" when it named none.
	Model string
	// Failovers are the stream's moves to another endpoint mid-answer, in
	// order. After one, Usage is not reported: the caller bills the
	// prompt once and every piece of content it got once.
	Failovers []Failover
}

// Streamer streams one chat completion, calling onDelta for every piece
// of the answer in order. If onDelta returns an error the stream stops and
// Stream returns that error.
type Streamer interface {
	Stream(ctx context.Context, req Request, onDelta func(Delta) error) (Result, error)
}

// Error is a backend failure with the HTTP status, if any.
type Error struct {
	// Endpoint names the endpoint (EndpointName), never by its URL.
	Endpoint string
	Status   int
	Message  string
	// Deadline names the deadline that passed (DeadlineConnect, ...), if
	// one did.
	Deadline string
	// Retryable is true for failures a later attempt may not see:
	// connection errors, deadlines before the first token, 408, 429 and
	// 5xx.
	Retryable bool
}

func (e *Error) Error() string {
	if e.Status == 0 {
		return fmt.Sprintf("llm %s: %s", e.Endpoint, e.Message)
	}
	return fmt.Sprintf("llm %s: HTTP %d: %s", e.Endpoint, e.Status, e.Message)
}

// IsRetryable reports whether err is worth another attempt.
func IsRetryable(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Retryable
	}
	return false
}

// ContextTooLong reports a backend's refusal of a prompt longer than its
// model's context: a 400 whose body says context_length_exceeded
// (OpenAI's code) or "maximum context length" (vLLM's and the
// simulator's message).
func ContextTooLong(err error) bool {
	var e *Error
	if !errors.As(err, &e) || e.Status != http.StatusBadRequest {
		return false
	}
	return strings.Contains(e.Message, "context_length_exceeded") || strings.Contains(strings.ToLower(e.Message), "maximum context length")
}

// FirstTokenMissed reports a stream that ended because its first token
// missed the first-token deadline.
func FirstTokenMissed(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Deadline == DeadlineFirstToken
}

// OpenAI is a client for one pool's OpenAI-compatible endpoints, spread
// round robin over those whose circuit is not open.
type OpenAI struct {
	name      string
	endpoints []*endpoint
	apiKey    string
	http      *http.Client
	deadlines Deadlines
	breaker   Breaker
	next      atomic.Uint64
	tracer    trace.Tracer
	// continuation, maxFailovers and priority are OpenAIOptions'.
	continuation string
	maxFailovers int
	priority     string
}

// OpenAIOptions configures an OpenAI client.
type OpenAIOptions struct {
	// Name is the pool's, for errors and logs.
	Name string
	// Endpoints are base URLs; "/v1" is appended when they lack it.
	Endpoints []string
	APIKey    string
	// HTTPClient defaults to one with no overall timeout (streams are
	// bounded by the caller's context and the deadlines) that gives up
	// connecting after Deadlines.Connect.
	HTTPClient *http.Client
	Deadlines  Deadlines
	Breaker    Breaker
	// Logger reports circuits opening and closing (default: slog's).
	Logger *slog.Logger
	// Tracer, if set, traces each completion as a GenAI client span
	// (see trace.go); nil traces nothing.
	Tracer trace.TracerProvider
	// Continuation is how the pool's backend continues an answer another
	// endpoint began (ContinuationVLLM), which lets a stream that breaks
	// mid-answer fail over; "" or ContinuationNone: it cannot, and such a
	// stream fails.
	Continuation string
	// MaxFailovers bounds a stream's failovers (0: DefaultMaxFailovers).
	MaxFailovers int
	// Priority says whether the pool's backend takes a request priority
	// (PriorityVLLM: vLLM's priority field, which a vLLM refuses unless
	// it runs with --scheduling-policy priority); "" or PriorityNone:
	// none is sent.
	Priority string
}

// withDefaults fills what o leaves zero: each deadline and breaker
// setting from DefaultDeadlines and DefaultBreaker, and the logger.
func (o OpenAIOptions) withDefaults() OpenAIOptions {
	d, b := DefaultDeadlines(), DefaultBreaker()
	o.Deadlines = Deadlines{
		Connect:    cmp.Or(o.Deadlines.Connect, d.Connect),
		FirstToken: cmp.Or(o.Deadlines.FirstToken, d.FirstToken),
		TokenIdle:  cmp.Or(o.Deadlines.TokenIdle, d.TokenIdle),
	}
	o.Breaker = Breaker{
		Failures:       cmp.Or(o.Breaker.Failures, b.Failures),
		OpenFor:        cmp.Or(o.Breaker.OpenFor, b.OpenFor),
		SlowFirstToken: cmp.Or(o.Breaker.SlowFirstToken, b.SlowFirstToken),
	}
	o.Logger = cmp.Or(o.Logger, slog.Default())
	o.Continuation = cmp.Or(o.Continuation, ContinuationNone)
	o.Priority = cmp.Or(o.Priority, PriorityNone)
	o.MaxFailovers = cmp.Or(o.MaxFailovers, DefaultMaxFailovers)
	return o
}

// NewOpenAI returns a client.
func NewOpenAI(opts OpenAIOptions) (*OpenAI, error) {
	if len(opts.Endpoints) == 0 {
		return nil, errors.New("llm: no endpoints")
	}
	opts = opts.withDefaults()
	if opts.Continuation != ContinuationNone && opts.Continuation != ContinuationVLLM {
		return nil, fmt.Errorf("llm: continuation %q: want %s or %s", opts.Continuation, ContinuationNone, ContinuationVLLM)
	}
	if opts.Priority != PriorityNone && opts.Priority != PriorityVLLM {
		return nil, fmt.Errorf("llm: priority %q: want %s or %s", opts.Priority, PriorityNone, PriorityVLLM)
	}
	c := &OpenAI{
		name: opts.Name, apiKey: opts.APIKey, http: opts.HTTPClient,
		deadlines: opts.Deadlines, breaker: opts.Breaker,
		continuation: opts.Continuation, maxFailovers: opts.MaxFailovers, priority: opts.Priority,
	}
	if opts.Tracer == nil {
		opts.Tracer = noop.NewTracerProvider()
	}
	c.tracer = opts.Tracer.Tracer(tracerName)
	log := opts.Logger.With("pool", opts.Name)
	for i, e := range opts.Endpoints {
		e = strings.TrimRight(e, "/")
		if !strings.HasSuffix(e, "/v1") {
			e += "/v1"
		}
		c.endpoints = append(c.endpoints, newEndpoint(EndpointName(opts.Name, i), e, c.breaker, log))
	}
	if c.http == nil {
		c.http = newHTTPClient(c.deadlines.Connect)
	}
	return c, nil
}

// streamEvent is one data line of a stream as the client reads it: a
// chunk, or an error from a server that failed mid-answer. Only what is
// read is decoded, so that a server's quirks in the rest of a chunk do
// not break its streams.
type streamEvent struct {
	Model   string                 `json:"model"`
	Choices []openai.ChunkChoice   `json:"choices"`
	Usage   openai.Optional[Usage] `json:"usage"`
	Error   *openai.Error          `json:"error"`
}

// chatRequest is the body of a streamed completion of req, with usage
// asked for so that the backend's own count is recorded.
func chatRequest(req Request) openai.ChatRequest {
	cr := openai.ChatRequest{
		Model: req.Model, Messages: req.Messages, Sampling: req.Sampling,
		Stream: true, StreamOptions: &openai.StreamOptions{IncludeUsage: true},
	}
	if req.MaxTokens != 0 {
		// Zero leaves the cap to the backend.
		cr.MaxTokens = &req.MaxTokens
	}
	if req.Choices > 1 {
		cr.N = &req.Choices
	}
	cr.Priority = req.sendPriority
	return cr
}

// Stream implements Streamer. It fails fast with an *UnavailableError
// when every endpoint's circuit is open; otherwise each endpoint's
// circuit learns how its part of the stream went. An endpoint that fails
// mid-answer hands the answer to another when the pool's backend can
// continue one (failover.go).
func (c *OpenAI) Stream(ctx context.Context, req Request, onDelta func(Delta) error) (res Result, err error) {
	ctx, span := c.startSpan(ctx, req)
	defer func() { endSpan(span, res, err) }()
	req = c.withPriority(req)
	tr := newTranscript(onDelta)
	body, err := c.firstRequest(req, tr)
	if err != nil {
		return Result{}, err
	}
	t, err := c.pick()
	if err != nil {
		return Result{}, err
	}
	res = Result{Endpoint: t.ep.name}
	if req.Resume != nil {
		res.Chunks = req.Resume.Pieces
	}
	spanEndpoint(span, t.ep.url)
	err = c.attempt(ctx, t, body, &res, tr.deliver)
	failed := []*endpoint{t.ep}
	for err != nil && c.canFailover(ctx, req, &res, tr, err) {
		var ep *endpoint
		if ep, err = c.failover(ctx, req, &res, tr, failed, err); ep == nil {
			break
		}
		failed = append(failed, ep)
	}
	if req.Resume != nil {
		// The backend's usage covers only what this stream added.
		res.Usage, res.UsageReported = Usage{}, false
	}
	return res, err
}

// attempt streams body from the ticket's endpoint into res and reports
// the outcome to its circuit: the caller's own error does not count.
func (c *OpenAI) attempt(ctx context.Context, t *ticket, body []byte, res *Result, onDelta func(Delta) error) error {
	err := c.stream(ctx, t, body, res, onDelta)
	var callerErr callerError
	if errors.As(err, &callerErr) {
		t.report(errNotCounted)
		return callerErr.err
	}
	t.report(outcomeOf(err))
	return err
}

// callerError is an error of the caller's onDelta, told apart from the
// endpoint's so that it does not count against the endpoint.
type callerError struct{ err error }

func (e callerError) Error() string { return e.err.Error() }

// stream sends the request to the ticket's endpoint and reads its answer
// into res under the deadlines.
func (c *OpenAI) stream(ctx context.Context, t *ticket, body []byte, res *Result, onDelta func(Delta) error) error {
	start := time.Now()
	sctx, w := watch(ctx, c.deadlines)
	defer w.stop()
	hreq, err := http.NewRequestWithContext(sctx, http.MethodPost, t.ep.url+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return &Error{Endpoint: t.ep.name, Message: err.Error()}
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	if c.apiKey != "" {
		hreq.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.http.Do(hreq)
	if err != nil {
		return c.failed(ctx, sctx, res, fmt.Errorf("send request: %w", err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return &Error{
			Endpoint: t.ep.name, Status: resp.StatusCode, Message: strings.TrimSpace(string(msg)),
			Retryable: resp.StatusCode == 408 || resp.StatusCode == 429 || resp.StatusCode >= 500,
		}
	}
	first := true
	err = readStream(resp.Body, res, func(d Delta) error {
		w.pause()
		if first {
			first = false
			ttft := time.Since(start)
			t.firstToken(ttft)
			spanFirstToken(ctx, ttft)
		}
		if err := onDelta(d); err != nil {
			return callerError{err}
		}
		w.resume()
		return nil
	})
	if err == nil {
		return nil
	}
	var callerErr callerError
	if errors.As(err, &callerErr) {
		return err
	}
	return c.failed(ctx, sctx, res, err)
}

// failed names why a request or its stream failed: the caller gave up, a
// deadline passed (the stream's context says which), or the endpoint
// failed. A deadline or a broken connection is retryable until content
// has been streamed: another endpoint may answer.
func (c *OpenAI) failed(ctx, sctx context.Context, res *Result, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	e := &Error{Endpoint: res.Endpoint, Message: err.Error(), Retryable: res.Chunks == 0}
	var lerr *Error
	switch d, ok := passed(sctx); {
	case ok:
		e.Deadline, e.Message = d.name, d.Error()
	case connectTimedOut(err):
		e.Deadline = DeadlineConnect
		e.Message = fmt.Sprintf("connect deadline: no connection within %s: %v", c.deadlines.Connect, err)
	case errors.As(err, &lerr):
		// The stream itself was bad: a bad chunk, an error event, no end.
		return lerr
	}
	return e
}

// readStream reads an event stream into res, passing each piece of
// content to onContent, until [DONE] or the end of the body. A body that
// breaks is returned as is: the caller knows whether its context or a
// deadline broke it.
func readStream(body io.Reader, res *Result, onContent func(Delta) error) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue // comments, event names, blank separators
		}
		data := bytes.TrimSpace(line[len("data:"):])
		if bytes.Equal(data, []byte("[DONE]")) {
			return nil
		}
		var ev streamEvent
		if err := json.Unmarshal(data, &ev); err != nil {
			return &Error{Endpoint: res.Endpoint, Message: fmt.Sprintf("bad stream chunk %q: %v", truncate(data), err)}
		}
		if ev.Error != nil {
			return &Error{Endpoint: res.Endpoint, Message: ev.Error.Message}
		}
		if ev.Usage.Value != nil {
			res.Usage = *ev.Usage.Value
			res.UsageReported = true
		}
		if res.Model == "" {
			res.Model = ev.Model
		}
		for _, choice := range ev.Choices {
			d := Delta{ToolCalls: choice.Delta.ToolCalls, Choice: choice.Index}
			if choice.Delta.Content != nil {
				d.Text = *choice.Delta.Content
			}
			if d.Text != "" || len(d.ToolCalls) > 0 {
				if res.Chunks == 0 {
					d.Model = res.Model
				}
				res.Chunks++
				if err := onContent(d); err != nil {
					return err
				}
			}
			if choice.FinishReason != nil && *choice.FinishReason != "" {
				res.finished(choice.Index, *choice.FinishReason)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("stream broken: %w", err)
	}
	// Some servers end without [DONE]; a finish reason means the answer is complete.
	if res.FinishReason != "" {
		return nil
	}
	return &Error{Endpoint: res.Endpoint, Message: "stream ended without finish_reason or [DONE]", Retryable: true}
}

// finished records how choice ended.
func (r *Result) finished(choice int, reason string) {
	if choice == 0 {
		r.FinishReason = reason
	}
	if choice < 0 || choice > maxChoices {
		return
	}
	for len(r.Finishes) <= choice {
		r.Finishes = append(r.Finishes, "")
	}
	r.Finishes[choice] = reason
}

// maxChoices bounds the choices a stream's result records, against a
// backend that numbers them wildly.
const maxChoices = 128

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}
