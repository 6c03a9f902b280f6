package stack

import (
	"context"

	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// Prompt is the prompt Sluice builds for q on this stack (q's embedding,
// retrieval, rerank and the prompt template), so that what the bench
// sends a backend itself is exactly what Sluice would send it.
func (s *Stack) Prompt(ctx context.Context, q string) ([]openai.Message, error) {
	rt, cfg := s.Core, s.Config
	vec, _, err := rt.Chat.Embeddings.Get(ctx, q)
	if err != nil {
		return nil, err
	}
	res, _, err := rt.Chat.Retriever.Retrieve(ctx, retrieval.Query{KB: cfg.Retrieval.DefaultKB, Text: q, Vector: vec, K: cfg.Retrieval.Candidates})
	if err != nil {
		return nil, err
	}
	chunks, err := rt.Chat.Reranker.Rerank(ctx, q, res.Chunks, cfg.Retrieval.TopK)
	if err != nil {
		return nil, err
	}
	return rt.Prompts.Messages(chunks, q), nil
}
