package api

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/request"
)

// chatCompletionsPath is the OpenAI-compatible front door. Errors on it are
// rendered the way OpenAI clients parse them (see handleError).
const chatCompletionsPath = "/v1/chat/completions"

// kbHeader names the knowledge base for clients that cannot add a body
// field; the body's kb wins.
const kbHeader = "X-Sluice-KB"

func paramError(param, code, format string, args ...any) *apiError {
	e := badRequest(code, format, args...)
	e.Param = param
	return e
}

// paramOf names the request field a shared check refused, for OpenAI's
// error param.
var paramOf = map[string]string{
	"empty_query":    "messages",
	"bad_query":      "messages",
	"query_too_long": "messages",
	"bad_max_tokens": "max_tokens",
	"unknown_kb":     "kb",
}

func withParam(err error) error {
	var ae *apiError
	if errors.As(err, &ae) && ae.Param == "" {
		ae.Param = paramOf[ae.Code]
	}
	return err
}

// completionMeta is what every chunk and completion of one request repeats.
type completionMeta struct {
	ID      string
	Created int64
	Model   string
}

// header is the meta as the head of a response object of the given kind.
func (m completionMeta) header(object string) openai.Header {
	return openai.Header{ID: m.ID, Object: object, Created: m.Created, Model: m.Model}
}

// postChatCompletions is OpenAI's chat completions API over the same
// workflow as /v1/chat, in gateway mode (the client's messages to the
// model it names) or RAG mode (the same, after context retrieved from a
// knowledge base): streamed in OpenAI's chunk format, or answered in one
// JSON completion when stream is false.
func (s *Server) postChatCompletions(c echo.Context) error {
	who, err := s.authenticate(c)
	if err != nil {
		return err
	}
	body, err := readJSONBody(c, s.cfg.API.MaxBodyBytes)
	if err != nil {
		return err
	}
	cr, req, err := parseCompletionRequest(body, c.Request().Header.Get(kbHeader))
	if err != nil {
		return err
	}
	if err := s.validate(&req); err != nil {
		return withParam(err)
	}
	created := time.Now().Unix()
	id, sub, err := s.beginChat(c, who, &req, fingerprintOf(c.Path(), cr, c.Request().Header.Get(kbHeader)))
	if err != nil {
		return withParam(err)
	}
	defer sub.Close()
	// The answering model's name arrives with the first token; until
	// then (and for an answer from the cache) it is the pool's.
	model := cr.Model
	if p, ok := s.cfg.Pools.ByName()[req.pool]; ok {
		model = p.Model
	}
	meta := completionMeta{ID: "chatcmpl-" + id, Created: created, Model: model}
	if cr.Stream {
		return s.streamCompletion(c, sub, id, meta, cr.IncludeUsage())
	}
	return s.awaitCompletion(c, sub, id, meta)
}

// streamCompletion renders the request's events as OpenAI chunks.
func (s *Server) streamCompletion(c echo.Context, sub *events.Subscription, id string, meta completionMeta, includeUsage bool) error {
	sse, err := startSSE(c.Response(), id, s.cfg.API.StreamWriteTimeout)
	if err != nil {
		s.detach(id)
		return nil
	}
	// The server's own closing bytes follow the handler: bound them too.
	defer sse.arm()
	out := &chunkSink{out: sse, meta: meta, includeUsage: includeUsage}
	switch s.follow(c.Request().Context(), sub, id, out, true) {
	case endClientGone:
		s.detach(id)
	case endInterrupted:
		// An OpenAI client cannot resume: tell it the answer is cut short
		// (a stream that just stops would look complete), and end the
		// request rather than run it for nobody.
		_ = out.fail(&apiError{Status: http.StatusServiceUnavailable, Code: request.ReasonStreamInterrupted,
			Message: "The stream was interrupted (the server is restarting). Please retry."})
		_ = out.flush()
		s.signalDetach(id)
	}
	return nil
}

// awaitCompletion waits for the request's answer and sends it as one
// completion. A client that leaves first detaches, and so cancels the
// request, as on the SSE path.
func (s *Server) awaitCompletion(c echo.Context, sub *events.Subscription, id string, meta completionMeta) error {
	c.Response().Header().Set("X-Request-ID", id)
	var col answerCollector
	switch s.follow(c.Request().Context(), sub, id, &col, false) {
	case endClientGone:
		s.detach(id)
		return nil
	case endInterrupted:
		s.signalDetach(id)
		return unavailable("The request was interrupted (the server is restarting). Please retry.")
	}
	if col.failure != nil {
		return col.failure
	}
	meta.Model = cmp.Or(col.done.Model, meta.Model)
	return c.JSON(http.StatusOK, completionOf(meta, col.text.String(), col.calls, col.done))
}

// completion is OpenAI's non-streaming chat completion with Sluice's
// extension.
type completion struct {
	openai.Completion
	Sluice *sluiceInfo `json:"sluice,omitempty"`
}

// completionOf is the completion of a finished answer. Logprobs and
// refusal are sent as null, as OpenAI sends them, for clients that look
// for every field.
func completionOf(meta completionMeta, text string, calls []openai.ToolCall, d events.Done) completion {
	msg := openai.AssistantMessage{Role: openai.RoleAssistant, Content: &text, ToolCalls: calls, Refusal: openai.Null[string]()}
	if text == "" && len(calls) > 0 {
		// A message that only calls tools has null content, as at OpenAI.
		msg.Content = nil
	}
	return completion{
		Completion: openai.Completion{
			Header: meta.header(openai.ObjectChatCompletion),
			Choices: []openai.Choice{{
				Message:      msg,
				Logprobs:     openai.Null[json.RawMessage](),
				FinishReason: finishReason(d.FinishReason),
			}},
			Usage: usageOf(d.Usage),
		},
		Sluice: sluiceOf(d),
	}
}

// sluiceInfo is Sluice's extension of the final chunk and of the
// completion; OpenAI clients ignore fields they do not know.
type sluiceInfo struct {
	RequestID string   `json:"request_id"`
	Route     string   `json:"route"`
	KBVersion int64    `json:"kb_version"`
	Sources   []string `json:"sources,omitempty"`
	// ContextShed counts context chunks dropped to fit the pool; Cached
	// marks an answer served by the answer cache.
	ContextShed int  `json:"context_shed,omitempty"`
	Cached      bool `json:"cached,omitempty"`
}

func sluiceOf(d events.Done) *sluiceInfo {
	return &sluiceInfo{RequestID: d.RequestID, Route: d.Route, KBVersion: d.KBVersion, Sources: d.Sources,
		ContextShed: d.ContextShed, Cached: d.Cached}
}

func usageOf(u events.Usage) openai.Usage {
	return openai.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
}

// finishReason maps a backend's finish reason to one of OpenAI's: a
// backend may say "eos" or nothing where OpenAI says "stop".
func finishReason(r string) string {
	switch r {
	case openai.FinishLength, openai.FinishContentFilter, openai.FinishToolCalls:
		return r
	}
	return openai.FinishStop
}

// completionChunk is one OpenAI streaming chunk with Sluice's extension,
// which only the finish chunk carries.
type completionChunk struct {
	openai.Chunk
	Sluice *sluiceInfo `json:"sluice,omitempty"`
}

// chunkSink renders events as OpenAI chunks. Events that OpenAI has no
// chunk for (accepted, queue, stage) become SSE comments, which OpenAI
// parsers skip and a curious reader can see.
type chunkSink struct {
	out          sseWriter
	meta         completionMeta
	includeUsage bool
	// roleSent is set once a chunk carried the assistant role, which
	// OpenAI sends on the first chunk only.
	roleSent bool
}

func (k *chunkSink) write(ev events.Event) error {
	switch ev.Type {
	case events.TypeAccepted:
		return k.comment("accepted")
	case events.TypeQueue:
		var q events.Queue
		if json.Unmarshal(ev.Data, &q) != nil {
			return nil
		}
		return k.comment(fmt.Sprintf("queued position=%d estimated_wait_ms=%d", q.Position, q.EstimatedWaitMs))
	case events.TypeStage:
		var sg events.Stage
		if json.Unmarshal(ev.Data, &sg) != nil {
			return nil
		}
		return k.comment("stage " + sg.Stage)
	case events.TypeToken:
		var t events.Token
		if json.Unmarshal(ev.Data, &t) != nil {
			return nil
		}
		if t.Model != "" {
			// The first token names the model that answers; every chunk
			// repeats it.
			k.meta.Model = t.Model
		}
		delta := openai.Delta{ToolCalls: t.ToolCalls}
		if t.Text != "" || len(t.ToolCalls) == 0 {
			delta.Content = &t.Text
		}
		return k.data(k.chunk(delta, nil))
	case events.TypeDone:
		var d events.Done
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			return k.fail(&apiError{Status: http.StatusInternalServerError, Code: request.ReasonInternal, Message: "unreadable answer"})
		}
		if !k.roleSent && d.Model != "" {
			// An empty answer: no token named the model.
			k.meta.Model = d.Model
		}
		fr := finishReason(d.FinishReason)
		last := k.chunk(openai.Delta{}, &fr)
		if last.Choices[0].Delta.Role != "" {
			// An empty answer: its only chunk still says who speaks.
			empty := ""
			last.Choices[0].Delta.Content = &empty
		}
		last.Sluice = sluiceOf(d)
		if err := k.data(last); err != nil {
			return err
		}
		if k.includeUsage {
			if err := k.data(openai.Chunk{Header: k.meta.header(openai.ObjectChatCompletionChunk),
				Choices: []openai.ChunkChoice{}, Usage: openai.Of(usageOf(d.Usage))}); err != nil {
				return err
			}
		}
		return k.out.printf("data: [DONE]\n\n")
	case events.TypeRejected, events.TypeError:
		return k.fail(failureError(ev))
	}
	return nil
}

// chunk is the next chunk of the one choice, with the role on the first.
// Usage is null on it when the client asked for usage, which the last
// chunk carries.
func (k *chunkSink) chunk(delta openai.Delta, finish *string) completionChunk {
	if !k.roleSent {
		delta.Role, k.roleSent = "assistant", true
	}
	ch := openai.Chunk{Header: k.meta.header(openai.ObjectChatCompletionChunk),
		Choices: []openai.ChunkChoice{{Delta: delta, Logprobs: openai.Null[json.RawMessage](), FinishReason: finish}}}
	if k.includeUsage {
		ch.Usage = openai.Null[openai.Usage]()
	}
	return completionChunk{Chunk: ch}
}

// fail ends the stream with an error object, which OpenAI clients raise
// as an error (openai-go: ssestream.StreamError). No [DONE] follows.
func (k *chunkSink) fail(e *apiError) error {
	return k.data(e.openAI())
}

func (k *chunkSink) data(v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode chunk: %w", err)
	}
	return k.out.printf("data: %s\n\n", raw)
}

func (k *chunkSink) comment(text string) error {
	return k.out.printf(": %s\n\n", text)
}

func (k *chunkSink) keepAlive() error { return k.comment("keep-alive") }

func (k *chunkSink) flush() error { return k.out.flush() }

// answerCollector gathers a request's answer for a non-streaming reply.
type answerCollector struct {
	text strings.Builder
	// calls are the tool calls the answer asks for; callIndex maps a
	// streamed call's index to its place in calls.
	calls     []openai.ToolCall
	callIndex map[int]int
	done      events.Done
	failure   *apiError
}

func (col *answerCollector) write(ev events.Event) error {
	switch ev.Type {
	case events.TypeToken:
		var t events.Token
		if json.Unmarshal(ev.Data, &t) == nil {
			col.text.WriteString(t.Text)
			if len(t.ToolCalls) > 0 {
				if col.callIndex == nil {
					col.callIndex = map[int]int{}
				}
				col.calls = openai.AddToolCalls(col.calls, col.callIndex, t.ToolCalls)
			}
		}
	case events.TypeDone:
		if err := json.Unmarshal(ev.Data, &col.done); err != nil {
			col.failure = &apiError{Status: http.StatusInternalServerError, Code: request.ReasonInternal, Message: "unreadable answer"}
		}
	case events.TypeRejected, events.TypeError:
		col.failure = failureError(ev)
	}
	return nil
}

func (col *answerCollector) keepAlive() error { return nil }

func (col *answerCollector) flush() error { return nil }

// failureError is the HTTP error a rejected or error event amounts to.
func failureError(ev events.Event) *apiError {
	var f events.Failure
	if err := json.Unmarshal(ev.Data, &f); err != nil || f.Reason == "" {
		return &apiError{Status: http.StatusInternalServerError, Code: request.ReasonInternal, Message: "the request failed"}
	}
	e := &apiError{Code: f.Reason, Message: f.Message, RetryAfter: f.RetryAfterS}
	switch f.Reason {
	case request.ReasonQueueTimeout, request.ReasonQueueFull, request.ReasonTenantQueueFull, request.ReasonBackendUnavailable:
		e.Status = http.StatusServiceUnavailable
	case request.ReasonBackendError, request.ReasonStreamInterrupted:
		e.Status = http.StatusBadGateway
	case request.ReasonBadRequest:
		e.Status = http.StatusBadRequest
	case request.ReasonCancelled:
		// Not a status clients retry: someone meant it to stop.
		e.Status = http.StatusGone
	default:
		e.Status = http.StatusInternalServerError
	}
	return e
}
