package request

import (
	"context"
	"log/slog"
	"time"
)

// Finished is a finished request as its one log line tells it. It has no
// field for the prompt, the answer or the caller's key, so the line cannot
// carry them.
type Finished struct {
	RequestID string
	Tenant    string
	// Route is the pool, RouteCache, or empty when the request ended
	// before routing.
	Route   string
	Outcome string
	Reason  string
	// Stages are the stages that ran, in order, with their times.
	Stages []StageTime
	// TTFT is the client's wait for its first token, every stage before
	// it counted; 0 when no token came from a model.
	TTFT             time.Duration
	PromptTokens     int
	CompletionTokens int
	// Cached says which caches served the request: "answer" when the
	// answer cache did (no LLM call), else the stage caches that hit with
	// their tier ("embedding:memory,retrieval:redis"); "" for none.
	Cached string
	// TraceID is the request's trace when tracing is on.
	TraceID string
	// ServiceTier is the service class the request was served in (a
	// class of Classes); "" when it ended before the door chose one.
	ServiceTier string
	// Similar counts the requests of the same tenant refused for the same
	// reason since the previous line, which had no line of their own: the
	// door logs its refusals at most once per tenant and reason a window.
	Similar int
}

// StageTime is how long one stage took.
type StageTime struct {
	Stage string
	Ms    int64
}

// stageKeys are the log line's keys for each stage's milliseconds, in
// pipeline order.
var stageKeys = []struct{ stage, key string }{
	{StageEmbed, "embed_ms"},
	{StageAnswerCache, "answer_cache_ms"},
	{StageAdmission, "queue_wait_ms"},
	{StageRetrieval, "retrieval_ms"},
	{StageRerank, "rerank_ms"},
	{StageLLMFirstToken, "llm_first_token_ms"},
	{StageLLM, "llm_ms"},
}

// FinishedMessage is the message of a finished request's log line.
const FinishedMessage = "request finished"

// Log writes the request's line, FinishedMessage, at info level.
func (f Finished) Log(ctx context.Context, logger *slog.Logger) {
	logger.LogAttrs(ctx, slog.LevelInfo, FinishedMessage, f.attrs()...)
}

// attrs are the line's fields: the stages that ran only, each once (a
// stage that ran twice, as admission does after a lost permit, is summed).
func (f Finished) attrs() []slog.Attr {
	attrs := []slog.Attr{
		slog.String("requestID", f.RequestID), slog.String("tenant", f.Tenant),
		slog.String("route", f.Route), slog.String("outcome", f.Outcome), slog.String("reason", f.Reason),
	}
	if f.ServiceTier != "" {
		attrs = append(attrs, slog.String("service_tier", f.ServiceTier))
	}
	for _, sk := range stageKeys {
		var ms int64
		ran := false
		for _, st := range f.Stages {
			if st.Stage == sk.stage {
				ms, ran = ms+st.Ms, true
			}
		}
		if ran {
			attrs = append(attrs, slog.Int64(sk.key, ms))
		}
	}
	if f.TTFT > 0 {
		attrs = append(attrs, slog.Int64("ttft_ms", f.TTFT.Milliseconds()))
	}
	attrs = append(attrs,
		slog.Int("prompt_tokens", f.PromptTokens), slog.Int("completion_tokens", f.CompletionTokens),
		slog.String("cached", f.Cached))
	if f.TraceID != "" {
		attrs = append(attrs, slog.String("trace_id", f.TraceID))
	}
	if f.Similar > 0 {
		attrs = append(attrs, slog.Int("similar_since_last", f.Similar))
	}
	return attrs
}
