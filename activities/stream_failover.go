package activities

import (
	"log/slog"

	"github.com/sluice-dev/sluice/pkg/llm"
)

// noteFailovers logs and counts a stream's mid-answer failovers, however
// the stream ended: a resumed one is the answer's business as usual, one
// that could not resume explains a stream_interrupted.
func (a *Chat) noteFailovers(log *slog.Logger, pool string, failovers []llm.Failover) {
	for _, f := range failovers {
		a.Metrics.StreamFailover(pool, f.Outcome, f.Gap)
		log.Warn("llm stream failed over mid-answer", "from", f.From, "to", f.To, "after_tokens", f.AfterTokens,
			"reason", f.Reason, "outcome", f.Outcome, "gap_ms", f.Gap.Milliseconds())
	}
}

// streamFailovers are failovers as the activity reports them.
func streamFailovers(failovers []llm.Failover) []StreamFailover {
	var out []StreamFailover
	for _, f := range failovers {
		out = append(out, StreamFailover{
			From: f.From, To: f.To, AfterTokens: f.AfterTokens, Reason: f.Reason, Outcome: f.Outcome,
			GapMs: f.Gap.Milliseconds(), PromptTokens: f.PromptTokens,
		})
	}
	return out
}
