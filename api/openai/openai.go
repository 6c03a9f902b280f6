package openai

import (
	"cmp"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/follow"
	"github.com/sluice-dev/sluice/pkg/answer"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
)

// chatCompletionsPath is the OpenAI-compatible front door. Errors on it are
// rendered the way OpenAI clients parse them (see handleError).
const chatCompletionsPath = "/v1/chat/completions"

// kbHeader names the knowledge base for clients that cannot add a body
// field; the body's kb wins.
const kbHeader = "X-Sluice-KB"

func paramError(param, code, format string, args ...any) *refusal.Error {
	e := refusal.BadRequest(code, format, args...)
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
	var ae *refusal.Error
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
	// ServiceTier is the class the request is served in, which its
	// accepted event says.
	ServiceTier string
}

// header is the meta as the head of a response object of the given kind.
func (m completionMeta) header(object string) openai.Header {
	return openai.Header{ID: m.ID, Object: object, Created: m.Created, Model: m.Model, ServiceTier: m.ServiceTier}
}

// postChatCompletions is OpenAI's chat completions API over the same
// workflow as /v1/chat, in gateway mode (the client's messages to the
// model it names) or RAG mode (the same, after context retrieved from a
// knowledge base): streamed in OpenAI's chunk format, or answered in one
// JSON completion when stream is false.
func (s *Server) postChatCompletions(c echo.Context) error {
	who, err := s.auth.Chat(c)
	if err != nil {
		return err
	}
	body, err := httpio.ReadJSONBody(c, s.cfg.API.MaxBodyBytes)
	if err != nil {
		return err
	}
	cr, req, err := parseCompletionRequest(body, c.Request().Header.Get(kbHeader))
	if err != nil {
		return err
	}
	if err := s.door.Validate(&req); err != nil {
		return withParam(err)
	}
	created := time.Now().Unix()
	adm, err := httpio.Admit(c, s.door, who, &req, door.Fingerprint(c.Path(), cr, c.Request().Header.Get(kbHeader)))
	if err != nil {
		return withParam(err)
	}
	defer adm.Sub.Close()
	id := adm.ID
	// The answering model's name arrives with the first token; until
	// then (and for an answer from the cache) it is the pool's.
	model := cr.Model
	if p, ok := s.cfg.Pools.ByName()[adm.Pool]; ok {
		model = p.Model
	}
	meta := completionMeta{ID: "chatcmpl-" + id, Created: created, Model: model}
	if cr.Stream {
		return s.streamCompletion(c, adm.Sub, id, meta, cr.IncludeUsage())
	}
	return s.awaitCompletion(c, adm.Sub, id, meta)
}

// streamCompletion renders the request's events as OpenAI chunks.
func (s *Server) streamCompletion(c echo.Context, sub *events.Subscription, id string, meta completionMeta, includeUsage bool) error {
	return s.stream(c, sub, id, false, func(out httpio.SSEWriter) endingSink {
		return &chunkSink{out: out, meta: meta, includeUsage: includeUsage}
	})
}

// awaitCompletion waits for the request's answer and sends it as one
// completion.
func (s *Server) awaitCompletion(c echo.Context, sub *events.Subscription, id string, meta completionMeta) error {
	var col answerCollector
	if ok, err := s.await(c, sub, id, &col); !ok {
		return err
	}
	if col.failure != nil {
		return col.failure
	}
	meta.Model = cmp.Or(col.done.Model, meta.Model)
	meta.ServiceTier = cmp.Or(col.serviceTier, col.done.ServiceTier)
	return c.JSON(http.StatusOK, completionOf(meta, col.answers, col.done))
}

// endingSink is an OpenAI stream's sink, which can end the stream with an
// error its clients raise.
type endingSink interface {
	follow.Sink
	fail(e *refusal.Error) error
}

// stream follows a request's events into the sink newSink makes of the
// client's SSE stream. An OpenAI client cannot resume: when the stream is
// interrupted, it is told that the answer is cut short (a stream that
// just stops would look complete), and the request ends rather than run
// for nobody. A background request runs on when its reader leaves, and
// an interrupted reader is told where to read on.
func (s *Server) stream(c echo.Context, sub *events.Subscription, id string, background bool, newSink func(httpio.SSEWriter) endingSink) error {
	detach := s.follow.Detach
	if background {
		detach = func(string) {}
	}
	sse, err := httpio.StartSSE(c.Response(), id, s.cfg.API.StreamWriteTimeout)
	if err != nil {
		detach(id)
		return nil
	}
	// The server's own closing bytes follow the handler: bound them too.
	defer sse.Arm()
	out := newSink(sse)
	switch s.follow.Follow(c.Request().Context(), sub, id, out, true) {
	case follow.EndClientGone:
		detach(id)
	case follow.EndInterrupted:
		msg := "The stream was interrupted (the server is restarting). Please retry."
		if background {
			msg = "The stream was interrupted (the server is restarting); the response goes on. " +
				"Read on with GET /v1/responses/{id}?stream=true&starting_after= the last sequence_number you have."
		}
		_ = out.fail(&refusal.Error{Class: refusal.Unavailable, Code: request.ReasonStreamInterrupted, Message: msg})
		_ = out.Flush()
		if !background {
			s.follow.DetachNow(id)
		}
	}
	return nil
}

// await follows a request's events into out until its end, for an
// answer sent whole. It reports whether the answer is there to send; if
// not, err is what to answer instead (nil: the client left, which
// detaches, and so cancels the request, as on the SSE path).
func (s *Server) await(c echo.Context, sub *events.Subscription, id string, out follow.Sink) (bool, error) {
	c.Response().Header().Set("X-Request-ID", id)
	switch s.follow.Follow(c.Request().Context(), sub, id, out, false) {
	case follow.EndClientGone:
		s.follow.Detach(id)
		return false, nil
	case follow.EndInterrupted:
		s.follow.DetachNow(id)
		return false, refusal.Unreachable("The request was interrupted (the server is restarting). Please retry.")
	}
	return true, nil
}

// completion is OpenAI's non-streaming chat completion with Sluice's
// extension.
type completion struct {
	openai.Completion
	Sluice *sluiceInfo `json:"sluice,omitempty"`
}

// completionOf is the completion of a finished answer: a choice per
// answer, with its finish reason. Logprobs and refusal are sent as null,
// as OpenAI sends them, for clients that look for every field.
func completionOf(meta completionMeta, answers []*choiceAnswer, d events.Done) completion {
	finishes := finishReasons(d)
	for len(answers) < max(len(finishes), 1) {
		answers = append(answers, &choiceAnswer{})
	}
	choices := make([]openai.Choice, len(answers))
	for i, ans := range answers {
		text := ans.text.String()
		msg := openai.AssistantMessage{Role: openai.RoleAssistant, Content: &text, ToolCalls: ans.calls, Refusal: openai.Null[string]()}
		if text == "" && len(ans.calls) > 0 {
			// A message that only calls tools has null content, as at OpenAI.
			msg.Content = nil
		}
		fr := ""
		if i < len(finishes) {
			fr = finishes[i]
		}
		choices[i] = openai.Choice{Index: i, Message: msg, Logprobs: openai.Null[json.RawMessage](), FinishReason: answer.FinishReason(fr)}
	}
	return completion{
		Completion: openai.Completion{Header: meta.header(openai.ObjectChatCompletion), Choices: choices, Usage: usageOf(d.Usage)},
		Sluice:     sluiceOf(d),
	}
}

// finishReasons are the answer's finish reasons by choice: one, unless
// the client asked for several answers.
func finishReasons(d events.Done) []string {
	if len(d.FinishReasons) > 1 {
		return d.FinishReasons
	}
	return []string{d.FinishReason}
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
	// TraceID is the request's trace when tracing is on, as in the done
	// event: the way from a client's answer to its spans and log line.
	TraceID string `json:"trace_id,omitempty"`
	// Fallback says that the pool could not answer and a fallback did,
	// as in the done event; the completion's model names the one that
	// answered.
	Fallback *events.Fallback `json:"fallback,omitempty"`
	// Pauses is how often the stream was paused for a more urgent
	// request, as in the done event.
	Pauses int `json:"pauses,omitempty"`
}

func sluiceOf(d events.Done) *sluiceInfo {
	return &sluiceInfo{RequestID: d.RequestID, Route: d.Route, KBVersion: d.KBVersion, Sources: d.Sources,
		ContextShed: d.ContextShed, Cached: d.Cached, TraceID: d.TraceID, Fallback: d.Fallback, Pauses: d.Pauses}
}

func usageOf(u events.Usage) openai.Usage {
	return openai.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.TotalTokens}
}
