package stack

import (
	"context"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/worker"
)

func SamePrompt(ctx context.Context, rt *worker.Runtime, cfg config.Config, q string) ([]openai.Message, error) {
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
