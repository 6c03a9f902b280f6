package activities

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/pkg/backoff"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/pkg/tracing"
)

var errStopped = errors.New("stream stopped by request")

// StreamLLM streams the answer from the request's pool into its event
// stream, renewing the permit's lease and heartbeating as it goes. A
// failure before the first token is retryable; after it, it is not, because
// a model cannot resume mid-answer and the client already has a prefix.
func (a *Chat) StreamLLM(ctx context.Context, in LLMInput) (LLMOutput, error) {
	start := time.Now()
	log := a.logger(in.RequestID)
	// An earlier attempt may have streamed, or even finished, the answer:
	// never stream twice (stream_resume.go).
	prior, err := a.priorAttempt(ctx, in.RequestID)
	if err != nil {
		return LLMOutput{}, err
	}
	if prior.done != nil {
		return prior.answered(), nil
	}
	pool, ok := a.Pools[in.Pool]
	if !ok {
		return LLMOutput{}, temporal.NewNonRetryableApplicationError("unknown pool "+in.Pool, ErrTypeBadRequest, nil)
	}
	var chunks []retrieval.Chunk
	if !in.Gateway {
		chunks, err = a.lookup(ctx, in.KB, in.KBVersion, in.Context)
		if err != nil && prior.tokens == 0 {
			return LLMOutput{}, err
		}
	}
	p := a.fitPrompt(ctx, in, pool, chunks)
	var resume *llm.Resume
	if prior.tokens > 0 {
		if resume = a.resumable(ctx, log, in, pool, prior.tokens); resume == nil {
			return LLMOutput{}, a.interruptedBefore(log, prior.tokens, &p)
		}
	}
	if err := a.holdPermit(ctx, log, in); err != nil {
		return LLMOutput{}, err
	}
	s := a.newTokenStream(ctx, in, start, resume)
	defer func() { _ = s.stageWritten() }()

	sctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	s.sctx = sctx
	pz := a.pauserFor(in, pool)
	go a.keepAlive(sctx, stop, log, in, s.stopKey, &s.n, pz)
	if pz != nil {
		go a.listenForPause(sctx, in, pz)
	}

	model := cmp.Or(in.Model, pool.Model)
	req := llm.Request{Model: model, Messages: p.msgs, MaxTokens: in.MaxTokens, Choices: in.Choices, Resume: resume,
		Priority: llm.PriorityOf(in.ServiceTier)}
	if in.Sampling != nil {
		req.Sampling = *in.Sampling
	}
	res, err := a.streamPausing(sctx, log, in, pool, req, s, pz)
	// However the stream ended, the permit's time decoding ends here.
	a.Metrics.PermitDecoding(in.Pool, s.decoding())
	a.noteFailovers(log, in.Pool, res.Failovers)
	if err != nil && errors.Is(context.Cause(sctx), errStopped) {
		err = errStopped
	}
	if err := a.fallen(ctx, log, in, pool, err, s.tokens()); err != nil {
		return LLMOutput{}, err
	}
	if err := a.classifyStreamError(ctx, log, in.RequestID, err, s.tokens(), &p); err != nil {
		return LLMOutput{}, err
	}
	// The keep-alive renews the permit, which finishing gives back.
	stop(nil)
	res.Model = cmp.Or(res.Model, model)
	// The done event, the session's turn, the early release and the L3
	// entry (stream_finish.go).
	return a.finishAnswer(ctx, in, res, &p, s, pz.count())
}

// fittedPrompt is a request's prompt, cut to fit its pool.
type fittedPrompt struct {
	msgs []openai.Message
	// chunks is the context that stayed in the prompt.
	chunks []retrieval.Chunk
	// tokens is the prompt's exact size; 0 until it is counted.
	tokens int
}

// fitPrompt builds the prompt from the session's earlier turns, the context
// and the query. The cheap bound keeps exact tokenization off the time to
// first token; only a prompt near the pool's limit is counted exactly, and
// its lowest-ranked context shed until it fits, then its oldest turns.
func (a *Chat) fitPrompt(ctx context.Context, in LLMInput, pool Pool, chunks []retrieval.Chunk) fittedPrompt {
	if in.Gateway {
		// The client's prompt, as it came: the door counted it against
		// the pool's limit.
		return fittedPrompt{msgs: in.Conversation}
	}
	if len(in.Conversation) > 0 {
		return a.fitAround(in.Conversation, pool, chunks)
	}
	history, historyTokens := a.history(ctx, in.RequestID, in.Session)
	p := fittedPrompt{msgs: a.Prompts.Conversation(history, chunks, in.Query), chunks: chunks}
	if a.Prompts.Bound(chunks, in.Query)+historyTokens <= pool.MaxPromptTokens {
		return p
	}
	p.tokens = a.Prompts.Count(p.msgs)
	for p.tokens > pool.MaxPromptTokens && len(p.chunks)+len(history) > 0 {
		if len(p.chunks) > 0 {
			p.chunks = p.chunks[:len(p.chunks)-1]
		} else {
			history = history[1:]
		}
		p.msgs = a.Prompts.Conversation(history, p.chunks, in.Query)
		p.tokens = a.Prompts.Count(p.msgs)
	}
	return p
}

// fitAround is fitPrompt for a client's own conversation: the door
// checked that the conversation fits the pool with a full context, so
// only context is shed, lowest-ranked first, when the count says so.
func (a *Chat) fitAround(conversation []openai.Message, pool Pool, chunks []retrieval.Chunk) fittedPrompt {
	p := fittedPrompt{msgs: a.Prompts.Around(chunks, conversation), chunks: chunks}
	p.tokens = a.Prompts.Count(p.msgs)
	for p.tokens > pool.MaxPromptTokens && len(p.chunks) > 0 {
		p.chunks = p.chunks[:len(p.chunks)-1]
		p.msgs = a.Prompts.Around(p.chunks, conversation)
		p.tokens = a.Prompts.Count(p.msgs)
	}
	return p
}

// promptTokens is the prompt's exact size, counted on first need: only
// usage that the backend did not report needs it.
func (a *Chat) promptTokens(p *fittedPrompt) int {
	if p.tokens == 0 {
		p.tokens = a.Prompts.Count(p.msgs)
	}
	return p.tokens
}

// holdPermit checks that the request still holds its permit. The permit
// was handed over when the request's turn came. A waiter that took longer
// than a lease to wake (an overloaded worker or server) finds it reclaimed
// and given to someone else; calling the LLM then would exceed the pool's
// concurrency, so it queues again.
func (a *Chat) holdPermit(ctx context.Context, log *slog.Logger, in LLMInput) error {
	held, err := a.Gate.Renew(ctx, in.Pool, in.RequestID)
	if err != nil {
		return err
	}
	if !held {
		log.Warn("permit lease ran out before the stream started; queueing again", "pool", in.Pool)
		return temporal.NewNonRetryableApplicationError("permit lease ran out before the stream started", ErrTypePermitLost, nil)
	}
	return nil
}

// tokenStream is what one stream's token callback keeps: the tokens
// written, when the first came, and the answer's text.
type tokenStream struct {
	a *Chat
	// ctx is the activity's, which heartbeats go to; sctx the stream's,
	// cancelled when the stream must stop.
	ctx, sctx context.Context
	requestID string
	stopKey   string
	start     time.Time
	// stageWritten waits for the llm stage's event, which must precede
	// the first token's.
	stageWritten func() error
	keep         bool

	// n is read by the keep-alive loop too.
	n          atomic.Int64
	firstToken time.Duration
	answer     []string
}

// newTokenStream is the token callback's state for a stream that starts
// now, or that resumes the answer an earlier attempt began: its tokens
// are counted, its text kept and its llm stage event written already.
func (a *Chat) newTokenStream(ctx context.Context, in LLMInput, start time.Time, resume *llm.Resume) *tokenStream {
	s := &tokenStream{
		a: a, ctx: ctx, requestID: in.RequestID, stopKey: a.Events.StopKey(in.RequestID), start: start,
		// The answer's text is kept only when the session or the L3 tier needs it.
		keep: in.Session != nil || in.CacheAnswer,
	}
	if resume == nil {
		s.stageWritten = a.beginStage(ctx, in.RequestID, events.Stage{Stage: request.StageLLM, Pool: in.Pool})
		return s
	}
	s.stageWritten = func() error { return nil }
	s.n.Store(int64(resume.Pieces))
	if s.keep {
		s.answer = append(s.answer, resume.Text)
	}
	return s
}

// onToken writes one token to the event stream and heartbeats its
// progress; it ends the stream when the stop flag is up.
func (s *tokenStream) onToken(d llm.Delta) error {
	i := int(s.n.Load())
	if s.firstToken == 0 {
		s.firstToken = time.Since(s.start)
		if err := s.stageWritten(); err != nil {
			return err
		}
		s.stageWritten = func() error { return nil }
	}
	// A token's Redis write is not a span of its own (tracing.Untraced).
	stopped, err := s.a.writeToken(tracing.Untraced(s.sctx), s.requestID, events.Token{Text: d.Text, Index: i, ToolCalls: d.ToolCalls, Model: d.Model, Choice: d.Choice}, s.stopKey)
	if err != nil {
		return err
	}
	if s.keep {
		s.answer = append(s.answer, d.Text)
	}
	s.n.Add(1)
	activity.RecordHeartbeat(s.ctx, streamProgress{Tokens: i + 1})
	if stopped {
		return errStopped
	}
	return nil
}

func (s *tokenStream) tokens() int { return int(s.n.Load()) }

// decoding is how long the backend has been decoding: from its first
// token until now (0 before one came).
func (s *tokenStream) decoding() time.Duration {
	if s.firstToken == 0 {
		return 0
	}
	return time.Since(s.start) - s.firstToken
}

// tokenWritePatience is how long a token's write is retried while Redis
// is unreachable or stalled: a blip of a few seconds delays the answer
// instead of cutting it off. Time spent here is the caller's, not the
// backend's (the token-idle deadline does not count it).
const tokenWritePatience = 15 * time.Second

// writeToken appends one token event and reads the stop flag in the same
// round trip, retrying for tokenWritePatience. A retried write may append
// the token twice (the first attempt was applied but its reply lost):
// readers drop a token whose index they already sent.
func (a *Chat) writeToken(ctx context.Context, requestID string, tok events.Token, stopKey string) (bool, error) {
	index := tok.Index
	args, err := a.Events.XAddArgs(requestID, events.TypeToken, tok)
	if err != nil {
		return false, err
	}
	var stopped bool
	err = patiently(ctx, func() error {
		pipe := a.Redis.Pipeline()
		pipe.XAdd(ctx, args)
		stop := pipe.Exists(ctx, stopKey)
		_, err := pipe.Exec(ctx)
		stopped = stop.Val() == 1
		return err
	})
	if err != nil {
		return false, fmt.Errorf("write token %d of %s: %w", index, requestID, err)
	}
	return stopped, nil
}

// patiently calls f until it succeeds, backing off from 100 ms to 1 s, for
// up to tokenWritePatience or until ctx ends; it returns f's last error.
func patiently(ctx context.Context, f func() error) error {
	return backoff.Policy{First: 100 * time.Millisecond, Max: time.Second}.Retry(ctx, tokenWritePatience, f)
}

// classifyStreamError maps how a stream ended to the activity's error (nil:
// it completed). What a failed stream consumed goes with its error, for
// the refund.
func (a *Chat) classifyStreamError(ctx context.Context, log *slog.Logger, requestID string, err error, tokens int, p *fittedPrompt) error {
	consumed := func() events.Usage {
		if tokens == 0 {
			return events.Usage{}
		}
		promptTokens := a.promptTokens(p)
		return events.Usage{PromptTokens: promptTokens, CompletionTokens: tokens, TotalTokens: promptTokens + tokens}
	}
	var unavailable *llm.UnavailableError
	switch {
	case errors.Is(err, errStopped):
		return temporal.NewNonRetryableApplicationError("stream stopped: request cancelled", ErrTypeCancelled, nil, consumed())
	case errors.Is(ctx.Err(), context.Canceled):
		// Temporal cancelled the activity (the request was cancelled):
		// what it consumed goes with the cancellation, for the refund.
		return temporal.NewCanceledError(consumed())
	case ctx.Err() != nil:
		// It timed out: nobody reads what it returns.
		return ctx.Err()
	case err != nil && tokens > 0:
		log.Warn("llm stream broke mid-answer", "tokens", tokens, "err", err)
		return temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeStreamInterrupted, err, consumed())
	case errors.As(err, &unavailable):
		// Retrying within the activity's short backoff would find the
		// circuits still open; the client is told when to come back.
		log.Warn("llm pool unavailable", "retry_after", unavailable.RetryAfter, "err", err)
		return temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeBackendUnavailable, err,
			BackendUnavailable{RetryAfter: unavailable.RetryAfter})
	case err != nil && llm.IsRetryable(err):
		return temporal.NewApplicationErrorWithCause(err.Error(), ErrTypeBackend, err)
	case err != nil:
		var lerr *llm.Error
		if errors.As(err, &lerr) {
			// The client hears the status; the backend's body and address
			// are for operators (this log, and the cause in the Temporal
			// UI), not for whoever sent the prompt.
			log.Warn("llm backend refused the request", "err", err)
			return temporal.NewNonRetryableApplicationError(
				fmt.Sprintf("the language model refused the request (HTTP %d)", lerr.Status), ErrTypeBadRequest, err)
		}
		return fmt.Errorf("stream llm for %s: %w", requestID, err)
	}
	return nil
}
