package openai

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// embeddingsPath is OpenAI's embeddings API, served by the embedder
// Sluice's retrieval uses, through the same cache tier (L1).
const embeddingsPath = "/v1/embeddings"

// maxEmbeddingInputs bounds one request's inputs: each miss is a call to
// the embedder.
const maxEmbeddingInputs = 128

// maxEmbeddingInputTokens bounds one input, as OpenAI's models do.
const maxEmbeddingInputTokens = 8191

// embeddingInput is a checked embeddings request.
type embeddingInput struct {
	texts  []string
	base64 bool
	tokens int
	// dims is the vector length asked for, 0 when any: this embedder's
	// length is what it is, so another is refused.
	dims int
}

// postEmbeddings answers OpenAI's POST /v1/embeddings. It is charged
// like a chat request (one request, its input tokens) to the caller's
// tier; the tokens are not refunded, since the embedder read them all.
func (s *Server) postEmbeddings(c echo.Context) error {
	who, err := s.auth.Chat(c)
	if err != nil {
		return err
	}
	if s.embeddings == nil {
		return refusal.Unreachable("embeddings are not configured in this process")
	}
	body, err := httpio.ReadJSONBody(c, s.cfg.API.MaxBodyBytes)
	if err != nil {
		return err
	}
	in, err := s.parseEmbeddingRequest(body)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	charge, standing, err := s.door.ChargeTokens(ctx, who, in.tokens)
	httpio.WriteStanding(c.Response().Header(), standing)
	if err != nil {
		return err
	}
	list, err := s.embed(ctx, in)
	if err != nil {
		// Nothing was given to the caller: its charge goes back.
		s.door.Refund(ctx, charge)
		if ae, ok := err.(*refusal.Error); ok {
			return ae
		}
		s.logger.Warn("embeddings", "requestID", charge.ID, "err", err)
		return refusal.Unreachable("the embedder did not answer; please retry")
	}
	return c.JSON(http.StatusOK, list)
}

// parseEmbeddingRequest reads and checks an embeddings request: the model
// must be the embedder's, the input one string or an array of strings.
func (s *Server) parseEmbeddingRequest(body []byte) (embeddingInput, error) {
	var req openai.EmbeddingRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return embeddingInput{}, refusal.BadRequest("bad_json", "malformed JSON: %v", err)
	}
	if model := s.cfg.Embedding.Model; req.Model != model && req.Model != s.embeddings.Model() {
		return embeddingInput{}, &refusal.Error{Class: refusal.NotFound, Code: "model_not_found", Param: "model",
			Message: fmt.Sprintf("the embedding model here is %q, not %q", model, req.Model)}
	}
	in := embeddingInput{}
	if req.Dimensions != nil {
		in.dims = *req.Dimensions
	}
	switch req.EncodingFormat {
	case "", openai.EncodingFloat:
	case openai.EncodingBase64:
		in.base64 = true
	default:
		return embeddingInput{}, paramError("encoding_format", "invalid_value", "encoding_format must be float or base64")
	}
	texts, err := embeddingTexts(req.Input)
	if err != nil {
		return embeddingInput{}, err
	}
	for i, t := range texts {
		n := s.prompts.QueryTokens(t)
		if n > maxEmbeddingInputTokens {
			return embeddingInput{}, paramError("input", "input_too_long",
				"input[%d] has %d tokens; the limit is %d", i, n, maxEmbeddingInputTokens)
		}
		in.tokens += n
	}
	in.texts = texts
	return in, nil
}

// embeddingTexts reads input: a string or an array of 1 to
// maxEmbeddingInputs strings, none empty. Arrays of token ids are
// OpenAI's too, but mean nothing to an embedder with another tokenizer.
func embeddingTexts(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	var texts []string
	if len(raw) > 0 && raw[0] == '"' {
		var one string
		if err := json.Unmarshal(raw, &one); err != nil {
			return nil, paramError("input", "invalid_value", "input must be a string or an array of strings")
		}
		texts = []string{one}
	} else if err := json.Unmarshal(raw, &texts); err != nil || texts == nil {
		return nil, paramError("input", "invalid_value", "input must be a string or an array of strings (token arrays are not supported)")
	}
	if len(texts) == 0 || len(texts) > maxEmbeddingInputs {
		return nil, paramError("input", "invalid_value", "input must hold 1 to %d strings, got %d", maxEmbeddingInputs, len(texts))
	}
	for i, t := range texts {
		// The body's UTF-8 was checked as it was read.
		if strings.TrimSpace(t) == "" {
			return nil, paramError("input", "invalid_value", "input[%d] is empty", i)
		}
	}
	return texts, nil
}

// embed computes every input's vector through the cache.
func (s *Server) embed(ctx context.Context, in embeddingInput) (openai.EmbeddingList, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	list := openai.EmbeddingList{Object: openai.ObjectList, Model: s.cfg.Embedding.Model,
		Data: make([]openai.EmbeddingDatum, len(in.texts)), Usage: openai.EmbeddingUsage{PromptTokens: in.tokens, TotalTokens: in.tokens}}
	for i, t := range in.texts {
		vec, _, err := s.embeddings.Get(ctx, t)
		if err != nil {
			return list, fmt.Errorf("embed input %d: %w", i, err)
		}
		if in.dims != 0 && in.dims != len(vec) {
			return list, paramError("dimensions", "unsupported_value",
				"this embedder's vectors have %d dimensions; dimensions cannot change that", len(vec))
		}
		d := openai.EmbeddingDatum{Object: openai.ObjectEmbedding, Index: i, Embedding: vec}
		if in.base64 {
			d.Embedding = base64Vector(vec)
		}
		list.Data[i] = d
	}
	return list, nil
}

// base64Vector is OpenAI's base64 encoding of a vector: its float32s,
// little-endian.
func base64Vector(vec []float32) string {
	buf := make([]byte, 4*len(vec))
	for i, f := range vec {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(f))
	}
	return base64.StdEncoding.EncodeToString(buf)
}
