package app

import (
	"fmt"

	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/rerank"
	"github.com/sluice-dev/sluice/pkg/tracing"
)

// newEmbedder builds the configured embedder. Its Model names the model and
// its dimensions, and goes into every embedding and retrieval cache key and
// into the kb store's model check, so another model never reads vectors
// of this one.
//
// With tracing on (tp not nil), a remote model's calls are client spans
// named as OpenTelemetry's GenAI conventions name them.
func newEmbedder(cfg config.Embedding, tp trace.TracerProvider) (embed.Embedder, error) {
	switch cfg.Provider {
	case config.EmbeddingLocal:
		return embed.NewLocal(embed.LocalOptions{Dims: cfg.Dims}), nil
	case config.EmbeddingOpenAI:
		e, err := embed.NewOpenAI(embed.OpenAIOptions{
			BaseURL: cfg.Endpoint, Model: cfg.Model, Dimensions: cfg.Dims,
			APIKey: cfg.APIKey, Timeout: cfg.Timeout,
			HTTPClient: tracing.HTTPClient(tp, "embeddings "+cfg.Model,
				semconv.GenAIOperationNameEmbeddings, semconv.GenAIProviderNameOpenAI, semconv.GenAIRequestModel(cfg.Model)),
		})
		if err != nil {
			return nil, fmt.Errorf("embedding (provider openai): %w", err)
		}
		return e, nil
	}
	return nil, fmt.Errorf("embedding.provider: unknown provider %q (local or openai)", cfg.Provider)
}

// caseSensitive reports whether the embedder may embed "Redis" and "redis"
// differently, so that caches must keep the query's case. Local lower-cases
// everything itself; a remote model's tokenizer usually does not.
func caseSensitive(cfg config.Embedding) bool {
	return cfg.Provider != config.EmbeddingLocal
}

// newReranker builds the configured reranker; with tracing on, a remote
// one's calls are client spans ("rerank <model>": the GenAI conventions
// name no rerank operation).
func newReranker(cfg config.Rerank, tp trace.TracerProvider) (rerank.Reranker, error) {
	switch cfg.Provider {
	case config.RerankLexical:
		return rerank.NewLexical(rerank.LexicalOptions{}), nil
	case config.RerankHTTP:
		r, err := rerank.NewHTTP(rerank.HTTPOptions{
			BaseURL: cfg.Endpoint, Model: cfg.Model, APIKey: cfg.APIKey,
			Timeout: cfg.Timeout, MaxBatch: cfg.MaxBatch,
			HTTPClient: tracing.HTTPClient(tp, "rerank "+cfg.Model, semconv.GenAIRequestModel(cfg.Model)),
		})
		if err != nil {
			return nil, fmt.Errorf("rerank (provider http): %w", err)
		}
		return r, nil
	}
	return nil, fmt.Errorf("rerank.provider: unknown provider %q (lexical or http)", cfg.Provider)
}
