package activities

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

// EmbedQuery looks the query's embedding up in the L1 cache, computing and
// storing it on a miss.
func (a *Chat) EmbedQuery(ctx context.Context, in EmbedInput) (EmbedOutput, error) {
	start := time.Now()
	written := a.beginStage(ctx, in.RequestID, events.Stage{Stage: request.StageEmbed})
	vec, tier, err := a.Embeddings.Get(ctx, in.Query)
	if werr := written(); werr != nil {
		return EmbedOutput{}, werr
	}
	if err != nil {
		return EmbedOutput{}, fmt.Errorf("embed query of %s: %w", in.RequestID, err)
	}
	return EmbedOutput{Cache: tier, Dims: len(vec), Ms: time.Since(start).Milliseconds()}, nil
}
