package rerank

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// HTTPOptions configures HTTP.
type HTTPOptions struct {
	// BaseURL is the server root; requests go to BaseURL + "/rerank".
	// Required.
	BaseURL string
	// Model names the model the server runs. It is not sent (TEI serves
	// one model per server) but makes up Version. Required.
	Model string
	// APIKey, if set, is sent as a bearer token.
	APIKey string
	// HTTPClient sends the requests. Default: a client without a timeout of
	// its own, since Timeout and the context bound each call.
	HTTPClient *http.Client
	// Timeout bounds one Rerank call, all batches together. Default 5s.
	Timeout time.Duration
	// MaxBatch is the most texts per request; more candidates are sent in
	// several requests. Default 32, TEI's default max_client_batch_size.
	MaxBatch int
	// Truncate asks the server to cut texts longer than the model's input
	// instead of rejecting the request.
	Truncate bool
}

// HTTP reranks with a cross-encoder served behind the rerank API of
// Hugging Face Text Embeddings Inference: POST /rerank with
// {"query": q, "texts": [...]} answering [{"index": i, "score": s}, ...].
// Each text is the chunk's title and text. Scores of a cross-encoder are
// per pair, so batches can be merged. It is safe for concurrent use.
type HTTP struct {
	opts HTTPOptions
	url  string
}

// NewHTTP validates opts and returns the client.
func NewHTTP(opts HTTPOptions) (*HTTP, error) {
	if opts.BaseURL == "" {
		return nil, errors.New("new http reranker: BaseURL is required")
	}
	if opts.Model == "" {
		return nil, errors.New("new http reranker: Model is required (it versions cached results)")
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{}
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 32
	}
	return &HTTP{opts: opts, url: strings.TrimRight(opts.BaseURL, "/") + "/rerank"}, nil
}

// Version returns "http:" + Model.
func (h *HTTP) Version() string { return "http:" + h.opts.Model }

type httpRequest struct {
	Query    string   `json:"query"`
	Texts    []string `json:"texts"`
	Truncate bool     `json:"truncate,omitempty"`
}

type httpResult struct {
	Index int     `json:"index"`
	Score float64 `json:"score"`
}

// Rerank sends the candidates to the server and orders them by its scores.
// Candidates the server leaves out are dropped.
func (h *HTTP) Rerank(ctx context.Context, query string, chunks []retrieval.Chunk, k int) ([]retrieval.Chunk, error) {
	if len(chunks) == 0 {
		return []retrieval.Chunk{}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, h.opts.Timeout)
	defer cancel()
	seen := make([]bool, len(chunks))
	s := make([]scored, 0, len(chunks))
	for lo := 0; lo < len(chunks); lo += h.opts.MaxBatch {
		hi := min(lo+h.opts.MaxBatch, len(chunks))
		results, err := h.post(ctx, query, chunks[lo:hi])
		if err != nil {
			return nil, fmt.Errorf("rerank chunks %d-%d with %s: %w", lo, hi-1, h.opts.Model, err)
		}
		for _, r := range results {
			i := lo + r.Index
			if r.Index < 0 || i >= hi || seen[i] {
				return nil, fmt.Errorf("rerank chunks %d-%d with %s: bad or repeated index %d in response", lo, hi-1, h.opts.Model, r.Index)
			}
			seen[i] = true
			s = append(s, scored{idx: i, score: r.Score})
		}
	}
	if len(s) == 0 {
		return nil, fmt.Errorf("rerank %d chunks with %s: no scores in response", len(chunks), h.opts.Model)
	}
	// The server sorts by score; putting the input order back first makes
	// the stable sort in top resolve ties in retrieval order.
	slices.SortFunc(s, func(a, b scored) int { return a.idx - b.idx })
	return top(chunks, s, k), nil
}

func (h *HTTP) post(ctx context.Context, query string, chunks []retrieval.Chunk) ([]httpResult, error) {
	texts := make([]string, len(chunks))
	for i, c := range chunks {
		texts[i] = c.Text
		if c.Title != "" {
			texts[i] = c.Title + "\n\n" + c.Text
		}
	}
	body, err := json.Marshal(httpRequest{Query: query, Texts: texts, Truncate: h.opts.Truncate})
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if h.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+h.opts.APIKey)
	}
	resp, err := h.opts.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, embed.ReadAPIError(resp)
	}
	var results []httpResult
	if err := json.NewDecoder(resp.Body).Decode(&results); err != nil {
		return nil, fmt.Errorf("decode response from %s: %w", h.url, err)
	}
	return results, nil
}
