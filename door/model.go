package door

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// RAGModel is the model alias that asks for an answer from a knowledge
// base: "sluice-rag" from the default kb, "sluice-rag/<kb>" from kb. Any
// other model is a backend model, answered in gateway mode unless the
// request names a kb (the kb field or X-Sluice-KB).
const RAGModel = "sluice-rag"

// MediaPartTokens is what a content part that is neither text nor an
// image (a sound, a file) is counted as at the door, where only text is
// counted. The backend's usage says what it really took; this only
// routes the request and sizes its reservation.
const MediaPartTokens = 1024

// MediaTokens is what a content part that is not text is counted as: an
// image as OpenAI's tile-counting models count it (tokens.Image: by the
// size a data: URL's header gives, else the most an image can cost), any
// other part MediaPartTokens. It is an upper bound for those models;
// one that counts images higher (a LLaVA-style model takes up to a few
// thousand tokens an image) is charged what it used when the request
// settles, and the overrun is flagged (budget.Counter.Settle).
func MediaTokens(p openai.ContentPart) int {
	if p.Type != openai.ContentPartImage {
		return MediaPartTokens
	}
	if p.ImageURL == nil {
		return tokens.ImageMax
	}
	return tokens.Image(p.ImageURL.URL, p.ImageURL.Detail)
}

// checkConversation counts an OpenAI request's prompt and checks that
// some pool can take it: its model, its size and what it asks for.
func (d *Door) checkConversation(req *Request) error {
	req.promptTokens = d.prompts.Count(req.Conversation) + req.MediaTokens
	if req.Sampling != nil && len(req.Sampling.Tools) > 0 {
		// Tool definitions are part of the prompt the model reads.
		raw, _ := json.Marshal(req.Sampling.Tools)
		req.promptTokens += d.prompts.QueryTokens(string(raw))
	}
	if req.Model == "" {
		return nil
	}
	for _, p := range d.cfg.Pools.ByName() {
		if p.Model == req.Model {
			return nil
		}
	}
	return &refusal.Error{Class: refusal.NotFound, Code: "model_not_found", Param: "model",
		Message: fmt.Sprintf("the model %q is not served here; GET /v1/models lists the models, and %q answers from a knowledge base", req.Model, RAGModel)}
}

// poolFor is the pool that answers req: the one its length routes it to,
// unless the model it names is served only by the other, which it must
// then fit. What the pool's backend cannot do is refused.
func (d *Door) poolFor(routed string, req *Request) (string, error) {
	pools := d.cfg.Pools.ByName()
	pool := routed
	if req.Model != "" && pools[routed].Model != req.Model {
		for name, p := range pools {
			if p.Model == req.Model {
				pool = name
			}
		}
		if bound := d.promptBound(req); bound > pools[pool].MaxPromptTokens {
			to, ok := fallbackTaking(pools, pool, bound)
			if !ok {
				return "", &refusal.Error{Class: refusal.Invalid, Code: "context_length_exceeded", Param: "messages",
					Message: fmt.Sprintf("this model's maximum context length is %d tokens; the messages take up to %d", pools[pool].MaxPromptTokens, bound)}
			}
			req.fallback = &events.Fallback{From: req.Model, To: pools[to].Model, FromPool: pool, ToPool: to, Reason: request.FallbackContextTooLong}
			pool = to
		}
	}
	unsupported := pools[pool].Unsupported
	asked := append([]string(nil), req.PartTypes...)
	if req.Sampling != nil {
		asked = append(asked, req.Sampling.Set()...)
	}
	if req.Choices > 1 {
		asked = append(asked, openai.ParamN)
	}
	for _, a := range asked {
		if slices.Contains(unsupported, a) {
			return "", badParam(a, "unsupported_parameter", "%s is not supported by the model %q", a, pools[pool].Model)
		}
	}
	return pool, nil
}

// fallbackTaking is the first of pool's fallback pools whose prompt limit
// takes bound tokens: a prompt too long for the model the client named
// goes there rather than be refused. A model fallback on the pool's own
// endpoints has the pool's limit, so it cannot take it.
func fallbackTaking(pools map[string]config.Pool, pool string, bound int) (string, bool) {
	for _, f := range pools[pool].Fallbacks {
		if f.Pool != "" && bound <= pools[f.Pool].MaxPromptTokens {
			return f.Pool, true
		}
	}
	return "", false
}

// badParam is a 400 that names the request field at fault, for
// OpenAI-shaped errors.
func badParam(param, code, format string, args ...any) *refusal.Error {
	e := refusal.BadRequest(code, format, args...)
	e.Param = param
	return e
}
