package rerank

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-dev/sluice/pkg/embed"
	"github.com/sluice-dev/sluice/pkg/retrieval"
)

// teiServer answers like TEI: a score per text, sorted by score. Here the
// score is the number of times the query occurs in the text.
func teiServer(t *testing.T, requests *atomic.Int64) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.Method != http.MethodPost || r.URL.Path != "/rerank" {
			t.Errorf("got %s %s, want POST /rerank", r.Method, r.URL.Path)
		}
		var req struct {
			Query    string   `json:"query"`
			Texts    []string `json:"texts"`
			Truncate bool     `json:"truncate"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("decode request: %v", err)
		}
		type result struct {
			Index int     `json:"index"`
			Score float64 `json:"score"`
		}
		var out []result
		for i, text := range req.Texts {
			out = append(out, result{i, float64(strings.Count(text, req.Query))})
		}
		slices.SortStableFunc(out, func(a, b result) int { return int(b.Score - a.Score) })
		_ = json.NewEncoder(w).Encode(out)
	}))
}

func TestHTTPRerankOrdersByServerScore(t *testing.T) {
	var requests atomic.Int64
	srv := teiServer(t, &requests)
	defer srv.Close()
	h, err := NewHTTP(HTTPOptions{BaseURL: srv.URL + "/", Model: "BAAI/bge-reranker-base", MaxBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	in := []retrieval.Chunk{
		{ID: "a", Text: "nothing", Score: 0.9},
		{ID: "b", Text: "kv kv", Score: 0.8},
		{ID: "c", Text: "kv", Score: 0.7},
		{ID: "d", Text: "kv kv kv", Score: 0.6},
		{ID: "e", Text: "kv", Score: 0.5},
	}
	out, err := h.Rerank(context.Background(), "kv", in, 4)
	if err != nil {
		t.Fatal(err)
	}
	// Three batches of at most 2; ties (c, e) stay in input order.
	if got := ids(out); !slices.Equal(got, []string{"d", "b", "c", "e"}) {
		t.Errorf("order = %v, want d b c e", got)
	}
	if out[0].Score != 3 || out[3].Score != 1 {
		t.Errorf("scores not taken from the server: %v", out)
	}
	if n := requests.Load(); n != 3 {
		t.Errorf("%d requests for 5 texts in batches of 2, want 3", n)
	}
	if h.Version() != "http:BAAI/bge-reranker-base" {
		t.Errorf("Version() = %q", h.Version())
	}
}

func TestHTTPRerankErrors(t *testing.T) {
	cases := []struct {
		name, body string
		status     int
		want       string
	}{
		{"server error", `{"error":"model overloaded","error_type":"Overloaded"}`, 503, "503: model overloaded"},
		{"bad index", `[{"index":5,"score":1}]`, 200, "bad or repeated index 5"},
		{"repeated index", `[{"index":0,"score":1},{"index":0,"score":0.5}]`, 200, "bad or repeated index 0"},
		{"empty", `[]`, 200, "no scores"},
		{"not json", `oops`, 200, "decode response"},
	}
	in := []retrieval.Chunk{{ID: "a", Text: "x"}, {ID: "b", Text: "y"}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			h, _ := NewHTTP(HTTPOptions{BaseURL: srv.URL, Model: "m"})
			_, err := h.Rerank(context.Background(), "q", in, 2)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			var apiErr *embed.APIError
			if tc.status != 200 && (!errors.As(err, &apiErr) || !apiErr.Retryable()) {
				t.Errorf("503 not a retryable *embed.APIError: %v", err)
			}
		})
	}
}

func TestHTTPRequestShape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("Authorization"); got != "Bearer k" {
			t.Errorf("Authorization = %q", got)
		}
		var req map[string]any
		_ = json.NewDecoder(r.Body).Decode(&req)
		texts, _ := req["texts"].([]any)
		if req["query"] != "q" || req["truncate"] != true || len(texts) != 1 || texts[0] != "Title\n\nbody" {
			t.Errorf("request = %v", req)
		}
		_, _ = w.Write([]byte(`[{"index":0,"score":0.25}]`))
	}))
	defer srv.Close()
	h, _ := NewHTTP(HTTPOptions{BaseURL: srv.URL, Model: "m", APIKey: "k", Truncate: true})
	out, err := h.Rerank(context.Background(), "q", []retrieval.Chunk{{ID: "a", Title: "Title", Text: "body"}}, 1)
	if err != nil || len(out) != 1 || out[0].Score != 0.25 {
		t.Fatalf("Rerank = %v, %v", out, err)
	}
	if out, err := h.Rerank(context.Background(), "q", nil, 1); err != nil || len(out) != 0 {
		t.Errorf("no candidates: %v, %v", out, err)
	}
	if _, err := NewHTTP(HTTPOptions{BaseURL: srv.URL}); err == nil {
		t.Error("NewHTTP without Model succeeded")
	}
	if _, err := NewHTTP(HTTPOptions{Model: "m"}); err == nil {
		t.Error("NewHTTP without BaseURL succeeded")
	}
}
