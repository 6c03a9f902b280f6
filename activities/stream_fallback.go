package activities

import (
	"cmp"
	"context"
	"errors"
	"log/slog"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/request"
)

// fallen is the ErrTypeFallback error of a stream that failed before its
// first token in a way the request's next fallback may answer, nil
// otherwise (classifyStreamError then says what it was). Only a request
// that has a fallback left is told so (in.FallBack): one without ends as
// it always did.
func (a *Chat) fallen(ctx context.Context, log *slog.Logger, in LLMInput, pool Pool, err error, tokens int) error {
	if !in.FallBack || err == nil || tokens > 0 || ctx.Err() != nil || errors.Is(err, errStopped) {
		return nil
	}
	var reason string
	switch {
	case errors.Is(err, llm.ErrUnavailable):
		reason = request.ReasonBackendUnavailable
	case llm.ContextTooLong(err):
		reason = request.FallbackContextTooLong
	case llm.FirstTokenMissed(err) && lastEndpointAttempt(ctx, pool):
		reason = request.FallbackFirstTokenTimeout
	default:
		return nil
	}
	log.Warn("llm pool could not answer; falling back", "pool", in.Pool, "model", cmp.Or(in.Model, pool.Model), "reason", reason, "err", err)
	return temporal.NewNonRetryableApplicationError("the pool could not answer ("+reason+"): "+err.Error(), ErrTypeFallback, err, Fallen{Reason: reason, Model: cmp.Or(in.Model, pool.Model)})
}

// lastEndpointAttempt reports whether this attempt is the last one the
// pool gets: it has had one per endpoint (the round robin gives each
// attempt the next endpoint), or the retry policy allows no more.
func lastEndpointAttempt(ctx context.Context, pool Pool) bool {
	info := activity.GetInfo(ctx)
	last := max(pool.Endpoints, 1)
	if rp := info.RetryPolicy; rp != nil && rp.MaximumAttempts > 0 {
		last = min(last, int(rp.MaximumAttempts))
	}
	return int(info.Attempt) >= last
}
