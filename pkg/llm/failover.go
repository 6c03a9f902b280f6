package llm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/openai"
)

// How a pool's backend continues an answer that another endpoint began.
const (
	// ContinuationNone: it cannot; a stream that breaks after its first
	// token ends interrupted.
	ContinuationNone = "none"
	// ContinuationVLLM: vLLM's continue_final_message with
	// add_generation_prompt false, the text streamed so far sent as the
	// final assistant message (Sluice's simulator takes the same).
	ContinuationVLLM = "vllm"
)

// DefaultMaxFailovers is how many times one stream may move to another
// endpoint mid-answer when the options set no number.
const DefaultMaxFailovers = 2

// Failover outcomes.
const (
	// FailoverResumed: another endpoint continued the answer (its first
	// piece of content reached the caller).
	FailoverResumed = "resumed"
	// FailoverFailed: the endpoint chosen failed before continuing.
	FailoverFailed = "failed"
	// FailoverNoEndpoint: no other endpoint had its circuit closed.
	FailoverNoEndpoint = "no_endpoint"
)

// Failover is one move of a stream to another endpoint mid-answer.
type Failover struct {
	// From is the endpoint that failed; To the one asked to continue (""
	// when there was none).
	From, To string
	// AfterTokens is how many pieces of content the caller had when From
	// failed.
	AfterTokens int
	// Reason is why From's stream ended: the deadline that passed
	// (token_idle), http_<status>, or broken (the connection, an error
	// event, an end without a finish).
	Reason  string
	Outcome string
	// Gap is the caller's wait for the continuation: from the last piece
	// of content before the failure to the first one after it (0 unless
	// resumed).
	Gap time.Duration
	// PromptTokens is the continuation's prompt as its backend reported
	// it: the conversation and the prefix processed again, a cost of the
	// failover rather than of the client's request (0: not reported).
	PromptTokens int
}

// transcript is what a stream has handed its caller: the answer's text,
// which another endpoint can continue, and when its last piece came.
type transcript struct {
	onDelta func(Delta) error
	text    strings.Builder
	last    time.Time
	// textOnly is false once a piece was not choice 0's text (a tool
	// call, another choice), which no continuation can take up.
	textOnly bool
}

func newTranscript(onDelta func(Delta) error) *transcript {
	return &transcript{onDelta: onDelta, textOnly: true}
}

// deliver hands d to the caller and keeps its text.
func (tr *transcript) deliver(d Delta) error {
	if d.Choice != 0 || len(d.ToolCalls) > 0 {
		tr.textOnly = false
	}
	if err := tr.onDelta(d); err != nil {
		return err
	}
	tr.text.WriteString(d.Text)
	tr.last = time.Now()
	return nil
}

// ErrCannotResume is Stream's refusal of a Request.Resume on a pool whose
// backend cannot continue an answer.
var ErrCannotResume = errors.New("llm: the pool's backend cannot continue an answer")

// firstRequest is the body of a stream's first request: req's, or the
// continuation of the answer req resumes, whose text the transcript then
// starts from.
func (c *OpenAI) firstRequest(req Request, tr *transcript) ([]byte, error) {
	cr := chatRequest(req)
	if r := req.Resume; r != nil {
		if c.continuation != ContinuationVLLM {
			return nil, ErrCannotResume
		}
		cr = continuation(req, r.Text, r.Pieces)
		tr.text.WriteString(r.Text)
		tr.last = time.Now()
	}
	body, err := json.Marshal(cr)
	if err != nil {
		return nil, fmt.Errorf("encode chat request: %w", err)
	}
	return body, nil
}

// canFailover reports whether a stream that ended with err after the
// failovers it already made may move to another endpoint: the pool's
// backend continues answers, the endpoint failed (a deadline, a break, a
// 5xx — not the caller, not a 4xx) after content that is text alone, the
// answer is not finished, and the budget has tokens left.
func (c *OpenAI) canFailover(ctx context.Context, req Request, res *Result, tr *transcript, err error) bool {
	var e *Error
	switch {
	case c.continuation != ContinuationVLLM || len(res.Failovers) >= c.maxFailovers:
		return false
	case ctx.Err() != nil || !errors.As(err, &e) || (e.Status != 0 && e.Status < 500):
		return false
	case res.Chunks == 0 || !tr.textOnly || req.Choices > 1 || res.FinishReason != "":
		return false
	}
	return req.MaxTokens == 0 || req.MaxTokens > res.Chunks
}

// failover asks another endpoint whose circuit is closed, none that
// failed this stream before, to continue the answer the caller has, and
// streams its continuation into the same caller: its pieces follow the
// ones before, and the result counts them on. It returns the stream's
// new error (nil: the answer finished), or cause when no endpoint could
// be asked.
func (c *OpenAI) failover(ctx context.Context, req Request, res *Result, tr *transcript, failed []*endpoint, cause error) (*endpoint, error) {
	f := Failover{From: res.Endpoint, AfterTokens: res.Chunks, Reason: reasonOf(cause)}
	t, ok := c.pickOther(failed)
	if !ok {
		f.Outcome = FailoverNoEndpoint
		res.Failovers = append(res.Failovers, f)
		return nil, cause
	}
	f.To = t.ep.name
	body, err := json.Marshal(continuation(req, tr.text.String(), res.Chunks))
	if err != nil {
		t.report(errNotCounted)
		return nil, fmt.Errorf("encode continuation request: %w", err)
	}
	part := Result{Endpoint: t.ep.name, Chunks: res.Chunks, Model: res.Model, Failovers: res.Failovers}
	resumed := false
	err = c.attempt(ctx, t, body, &part, func(d Delta) error {
		if !resumed {
			resumed, f.Gap = true, time.Since(tr.last)
		}
		return tr.deliver(d)
	})
	f.Outcome = FailoverFailed
	if resumed {
		f.Outcome = FailoverResumed
	}
	if part.UsageReported {
		f.PromptTokens = part.Usage.PromptTokens
	}
	// The client's bill is its prompt once and every piece streamed once,
	// which the caller counts; no one attempt's usage is that.
	part.Usage, part.UsageReported = Usage{}, false
	part.Failovers = append(part.Failovers, f)
	*res = part
	return t.ep, err
}

// continuation is the request that continues req's answer from the text
// the caller already has, with the budget that is left.
func continuation(req Request, prefix string, produced int) openai.ChatRequest {
	next := req
	next.Resume = nil
	next.Messages = append(slices.Clone(req.Messages), openai.TextMessage(openai.RoleAssistant, prefix))
	if req.MaxTokens != 0 {
		next.MaxTokens = req.MaxTokens - produced
	}
	cr := chatRequest(next)
	no := false
	cr.ContinueFinalMessage, cr.AddGenerationPrompt = true, &no
	return cr
}

// pickOther chooses, round robin, an endpoint whose circuit is closed
// and that is not one of failed: a half-open endpoint's probe is no place
// for an answer already under way.
func (c *OpenAI) pickOther(failed []*endpoint) (*ticket, bool) {
	n := uint64(len(c.endpoints))
	start := c.next.Add(1) - 1
	for i := range n {
		ep := c.endpoints[(start+i)%n]
		if slices.Contains(failed, ep) || ep.state() != CircuitClosed {
			continue
		}
		done, err := ep.cb.Allow()
		if err != nil {
			continue
		}
		return &ticket{c: c, ep: ep, done: done}, true
	}
	return nil, false
}

// reasonOf names why an endpoint's stream ended, for a Failover.
func reasonOf(err error) string {
	var e *Error
	switch {
	case !errors.As(err, &e):
		return "other"
	case e.Deadline != "":
		return e.Deadline
	case e.Status != 0:
		return fmt.Sprintf("http_%d", e.Status)
	default:
		return "broken"
	}
}
