package activities

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// Retrieve fetches candidate chunks through the L2 cache.
func (a *Chat) Retrieve(ctx context.Context, in RetrieveInput) (RetrieveOutput, error) {
	start := time.Now()
	written := a.beginStage(ctx, in.RequestID, events.Stage{Stage: request.StageRetrieval})
	res, hit, err := a.retrieve(ctx, in)
	if errors.Is(err, retrieval.ErrUnknownKB) && a.KBs != nil {
		// A configured kb that Redis lost (it restarted empty) is seeded
		// again, and the request goes on; any other is unknown.
		if restored, rerr := a.KBs.Restore(ctx, in.KB); rerr != nil {
			err = fmt.Errorf("restore knowledge base %s: %w", in.KB, rerr)
		} else if restored {
			res, hit, err = a.retrieve(ctx, in)
		}
	}
	if werr := written(); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		if errors.Is(err, retrieval.ErrUnknownKB) {
			return RetrieveOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeBadRequest, err)
		}
		if errors.Is(err, kbstore.ErrTooLarge) {
			// Every worker has the same budget: retrying here or on
			// another would only read the kb's size again.
			return RetrieveOutput{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeKBTooLarge, err)
		}
		return RetrieveOutput{}, fmt.Errorf("retrieve for %s: %w", in.RequestID, err)
	}
	return RetrieveOutput{KBVersion: res.KBVersion, Hits: refs(res.Chunks), CacheHit: hit, Ms: time.Since(start).Milliseconds()}, nil
}

func (a *Chat) retrieve(ctx context.Context, in RetrieveInput) (retrieval.Result, bool, error) {
	vec, _, err := a.Embeddings.Get(ctx, in.Query)
	if err != nil {
		return retrieval.Result{}, false, fmt.Errorf("embed query for retrieval: %w", err)
	}
	return a.Retriever.Retrieve(ctx, retrieval.Query{KB: in.KB, Text: in.Query, Vector: vec, K: in.K})
}

// Rerank orders the candidates and keeps the best K.
func (a *Chat) Rerank(ctx context.Context, in RerankInput) (RerankOutput, error) {
	start := time.Now()
	written := a.beginStage(ctx, in.RequestID, events.Stage{Stage: request.StageRerank})
	candidates, err := a.lookup(ctx, in.KB, in.KBVersion, in.Hits)
	if err != nil {
		_ = written()
		return RerankOutput{}, err
	}
	chunks, err := a.Reranker.Rerank(ctx, in.Query, candidates, in.K)
	if werr := written(); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return RerankOutput{}, fmt.Errorf("rerank for %s: %w", in.RequestID, err)
	}
	return RerankOutput{Hits: refs(chunks), Ms: time.Since(start).Milliseconds()}, nil
}

// lookup resolves refs to chunks carrying the refs' scores.
func (a *Chat) lookup(ctx context.Context, kb string, version int64, hits []ChunkRef) ([]retrieval.Chunk, error) {
	ids := make([]string, len(hits))
	for i, h := range hits {
		ids[i] = h.ID
	}
	chunks, err := a.Chunks.Lookup(ctx, kb, version, ids)
	switch {
	case errors.Is(err, retrieval.ErrUnknownKB), errors.Is(err, retrieval.ErrStaleKB):
		// An unknown kb, or chunks no longer stored in the version the
		// refs came from: the request cannot be answered from the context
		// it retrieved, and retrying changes nothing. The error is returned
		// as is, because Temporal classifies only the outermost error.
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeBadRequest, err)
	case errors.Is(err, kbstore.ErrTooLarge):
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), ErrTypeKBTooLarge, err)
	case err != nil:
		// Redis could not be read: retried, and reported as unavailable
		// (UnavailableInterceptor) if it stays so, never as the client's
		// mistake.
		return nil, fmt.Errorf("look up the context of %s: %w", kb, err)
	}
	for i := range chunks {
		chunks[i].Score = hits[i].Score
	}
	return chunks, nil
}

// refs names chunks by id and score, as stages pass them.
func refs(chunks []retrieval.Chunk) []ChunkRef {
	out := make([]ChunkRef, len(chunks))
	for i, c := range chunks {
		out[i] = ChunkRef{ID: c.ID, Score: c.Score}
	}
	return out
}
