package door

import (
	"context"
	"math"

	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
)

// route picks the request's pool by the rule and inputs admission uses:
// the prompt's bound before retrieval and the tokens of the session turns
// it will carry. The workflow is started with this pool, so the queue the
// door checks is the queue the request joins. A session that cannot be
// read is asked without its history, as the stream would.
func (d *Door) route(ctx context.Context, who Caller, req *Request) string {
	history := 0
	if req.SessionID != "" && d.sessions != nil {
		var err error
		_, history, err = d.sessions.History(ctx, d.prompts, who.SessionOwner(), req.SessionID, d.cfg.Sessions.HistoryTokens)
		if err != nil {
			d.logger.Warn("read session to route; routing without its history", "session", req.SessionID, "err", err)
		}
	}
	return request.Route(d.promptBound(req), history, d.cfg.Routing.ShortThresholdTokens)
}

// promptBound is the prompt's upper bound before retrieval: the query (or
// the client's conversation) and top_k full chunks; a gateway request's
// prompt is its conversation alone.
func (d *Door) promptBound(req *Request) int {
	switch {
	case req.Gateway:
		return req.promptTokens
	case req.Conversation != nil:
		return d.prompts.BoundForQueryTokens(req.promptTokens, d.cfg.Retrieval.TopK, d.cfg.Retrieval.ChunkTokens)
	}
	return d.prompts.BoundForQueryTokens(d.queryTokens(req), d.cfg.Retrieval.TopK, d.cfg.Retrieval.ChunkTokens)
}

// tokenBound is the most tokens a request can take: the prompt with a
// full context, the whole session budget and every output token it may
// produce.
func (d *Door) tokenBound(req *Request) int {
	tokens := d.promptBound(req) + max(req.Choices, 1)*(*req.MaxTokens)
	if req.SessionID != "" {
		tokens += d.cfg.Sessions.HistoryTokens
	}
	return tokens
}

// admissionTokens is the request's size in the fair queue and the
// waiting room when it takes its place: what is known of it then, the
// prompt's bound (tokenBound without the output). Its output is charged
// as it streams (pay as you go: admission.Gate.Charge), each token
// weighted admission.output_token_weight, so a request that asks a huge
// max_tokens, or names none, costs what it uses.
func (d *Door) admissionTokens(req *Request) int {
	return d.tokenBound(req) - max(req.Choices, 1)*(*req.MaxTokens)
}

// cost is what the rate limits charge a request up front: its token bound
// (a.tokens). The workflow refunds what it did not use when it ends. Only
// limits that count tokens need a cost.
func (d *Door) cost(live *policy.Policy, a arrival) int {
	if !live.Limits.Enabled || !RatesOf(a.tier).CountsTokens() {
		return 0
	}
	cost := a.tokens
	// While the healer throttles long requests, a request routed long must
	// find factor times its tokens in its buckets: a tenant's long
	// requests are refused sooner, short ones are unaffected. The refund still
	// gives back the unused part, so the factor bounds how many long
	// requests a tenant starts at once, not what it pays.
	if f := live.ChargeFactor(a.pool); f > 1 {
		cost = int(math.Ceil(float64(cost) * f))
	}
	return cost
}
