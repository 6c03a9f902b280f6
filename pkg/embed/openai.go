package embed

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// OpenAIOptions configures OpenAI.
type OpenAIOptions struct {
	// BaseURL is the server root, without "/v1"; requests go to
	// BaseURL + "/v1/embeddings". Required.
	BaseURL string
	// Model is sent as "model" and is part of Model(). Required.
	Model string
	// Dimensions, if positive, is sent as "dimensions" (text-embedding-3
	// models can shorten their vectors) and appended to Model().
	Dimensions int
	// APIKey, if set, is sent as a bearer token.
	APIKey string
	// HTTPClient sends the requests. Default: a client without a timeout of
	// its own, since Timeout and the context bound each call.
	HTTPClient *http.Client
	// Timeout bounds one Embed call, on top of the context's deadline.
	// Default 10s.
	Timeout time.Duration
}

// OpenAI embeds through an OpenAI-compatible POST /v1/embeddings endpoint
// (OpenAI, vLLM, TEI, Ollama, LiteLLM...). It is safe for concurrent use.
type OpenAI struct {
	opts  OpenAIOptions
	url   string
	model string
}

// APIError is a non-2xx answer from an embedding or rerank server.
type APIError struct {
	StatusCode int
	Message    string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("server answered %d: %s", e.StatusCode, e.Message)
}

// Retryable reports whether the same request may succeed later: the server
// was overloaded or failed, rather than rejecting the request.
func (e *APIError) Retryable() bool {
	return e.StatusCode == http.StatusTooManyRequests || e.StatusCode >= 500
}

// NewOpenAI validates opts and returns the client.
func NewOpenAI(opts OpenAIOptions) (*OpenAI, error) {
	if opts.BaseURL == "" {
		return nil, errors.New("new openai embedder: BaseURL is required")
	}
	if opts.Model == "" {
		return nil, errors.New("new openai embedder: Model is required")
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{}
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	model := opts.Model
	if opts.Dimensions > 0 {
		model += "/" + strconv.Itoa(opts.Dimensions)
	}
	return &OpenAI{
		opts:  opts,
		url:   strings.TrimRight(opts.BaseURL, "/") + "/v1/embeddings",
		model: model,
	}, nil
}

// Model returns the model name, with "/<dimensions>" when Dimensions is set.
func (o *OpenAI) Model() string { return o.model }

type openAIRequest struct {
	Model      string   `json:"model"`
	Input      []string `json:"input"`
	Dimensions int      `json:"dimensions,omitempty"`
}

type openAIResponse struct {
	Data []struct {
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	} `json:"data"`
}

// Embed sends all texts in one request; callers batch large inputs.
func (o *OpenAI) Embed(ctx context.Context, texts []string) ([][]float32, error) {
	if len(texts) == 0 {
		return nil, nil
	}
	body, err := json.Marshal(openAIRequest{Model: o.opts.Model, Input: texts, Dimensions: o.opts.Dimensions})
	if err != nil {
		return nil, fmt.Errorf("encode embeddings request: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, o.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("build embeddings request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if o.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.opts.APIKey)
	}
	resp, err := o.opts.HTTPClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("embed %d texts with %s: %w", len(texts), o.opts.Model, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("embed %d texts with %s: %w", len(texts), o.opts.Model, ReadAPIError(resp))
	}
	var out openAIResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("decode embeddings response from %s: %w", o.url, err)
	}
	if len(out.Data) != len(texts) {
		return nil, fmt.Errorf("decode embeddings response from %s: %d vectors for %d texts", o.url, len(out.Data), len(texts))
	}
	vecs := make([][]float32, len(texts))
	for _, d := range out.Data {
		if d.Index < 0 || d.Index >= len(texts) || vecs[d.Index] != nil {
			return nil, fmt.Errorf("decode embeddings response from %s: bad or repeated index %d", o.url, d.Index)
		}
		if len(d.Embedding) == 0 {
			return nil, fmt.Errorf("decode embeddings response from %s: empty vector at index %d", o.url, d.Index)
		}
		vecs[d.Index] = d.Embedding
	}
	return vecs, nil
}

// ReadAPIError turns a non-2xx response into an *APIError, taking the
// message from an OpenAI-style {"error":{"message":...}}, a TEI-style
// {"error":"..."} or the start of the body.
func ReadAPIError(resp *http.Response) *APIError {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	e := &APIError{StatusCode: resp.StatusCode}
	var structured struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(raw, &structured) == nil && len(structured.Error) > 0 {
		var obj struct {
			Message string `json:"message"`
		}
		var s string
		switch {
		case json.Unmarshal(structured.Error, &obj) == nil && obj.Message != "":
			e.Message = obj.Message
		case json.Unmarshal(structured.Error, &s) == nil && s != "":
			e.Message = s
		}
	}
	if e.Message == "" {
		e.Message = strings.TrimSpace(string(raw))
	}
	if e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e
}
