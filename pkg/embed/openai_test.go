package embed

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestOpenAIEmbed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/embeddings" {
			t.Errorf("got %s %s, want POST /v1/embeddings", r.Method, r.URL.Path)
		}
		if got := r.Header.Get("Authorization"); got != "Bearer sk-test" {
			t.Errorf("Authorization = %q", got)
		}
		if got := r.Header.Get("Content-Type"); got != "application/json" {
			t.Errorf("Content-Type = %q", got)
		}
		var req struct {
			Model      string   `json:"model"`
			Input      []string `json:"input"`
			Dimensions int      `json:"dimensions"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("decode request: %v", err)
		}
		if req.Model != "text-embedding-3-small" || req.Dimensions != 3 || len(req.Input) != 2 || req.Input[1] != "second" {
			t.Errorf("request = %+v", req)
		}
		// Out of order on purpose: clients must use "index".
		_, _ = w.Write([]byte(`{"object":"list","data":[
			{"object":"embedding","index":1,"embedding":[0,1,0]},
			{"object":"embedding","index":0,"embedding":[1,0,0]}],
			"model":"text-embedding-3-small","usage":{"prompt_tokens":2,"total_tokens":2}}`))
	}))
	defer srv.Close()

	o, err := NewOpenAI(OpenAIOptions{BaseURL: srv.URL + "/", Model: "text-embedding-3-small", Dimensions: 3, APIKey: "sk-test"})
	if err != nil {
		t.Fatal(err)
	}
	if o.Model() != "text-embedding-3-small/3" {
		t.Errorf("Model() = %q", o.Model())
	}
	vecs, err := o.Embed(context.Background(), []string{"first", "second"})
	if err != nil {
		t.Fatal(err)
	}
	if len(vecs) != 2 || vecs[0][0] != 1 || vecs[1][1] != 1 {
		t.Fatalf("vectors = %v", vecs)
	}
}

func TestOpenAIErrors(t *testing.T) {
	cases := []struct {
		name      string
		status    int
		body      string
		wantErr   string
		retryable bool
	}{
		{"rate limited", 429, `{"error":{"message":"Rate limit reached","type":"requests"}}`, "429: Rate limit reached", true},
		{"tei style", 413, `{"error":"batch size 3 > maximum allowed batch size 2","error_type":"Validation"}`, "413: batch size 3", false},
		{"plain text", 502, `bad gateway`, "502: bad gateway", true},
		{"short", 200, `{"data":[{"index":0,"embedding":[1]}]}`, "1 vectors for 2 texts", false},
		{"repeated index", 200, `{"data":[{"index":0,"embedding":[1]},{"index":0,"embedding":[1]}]}`, "bad or repeated index 0", false},
		{"empty vector", 200, `{"data":[{"index":0,"embedding":[]},{"index":1,"embedding":[1]}]}`, "empty vector at index 0", false},
		{"not json", 200, `<html>`, "decode embeddings response", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			o, _ := NewOpenAI(OpenAIOptions{BaseURL: srv.URL, Model: "m"})
			_, err := o.Embed(context.Background(), []string{"a", "b"})
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.wantErr)
			}
			var apiErr *APIError
			if errors.As(err, &apiErr) != (tc.status != 200) {
				t.Fatalf("errors.As(*APIError) = %v for status %d", !(tc.status != 200), tc.status)
			}
			if apiErr != nil && apiErr.Retryable() != tc.retryable {
				t.Errorf("Retryable() = %v, want %v", apiErr.Retryable(), tc.retryable)
			}
		})
	}
}

func TestOpenAITimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	o, _ := NewOpenAI(OpenAIOptions{BaseURL: srv.URL, Model: "m", Timeout: 50 * time.Millisecond})
	start := time.Now()
	_, err := o.Embed(context.Background(), []string{"a"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want a deadline error", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("Embed took %v with a 50ms timeout", time.Since(start))
	}
}

func TestOpenAIOptionsValidated(t *testing.T) {
	if _, err := NewOpenAI(OpenAIOptions{Model: "m"}); err == nil {
		t.Error("NewOpenAI without BaseURL succeeded")
	}
	if _, err := NewOpenAI(OpenAIOptions{BaseURL: "http://x"}); err == nil {
		t.Error("NewOpenAI without Model succeeded")
	}
	o, _ := NewOpenAI(OpenAIOptions{BaseURL: "http://127.0.0.1:1", Model: "m"})
	if vecs, err := o.Embed(context.Background(), nil); err != nil || vecs != nil {
		t.Errorf("Embed(nil) = %v, %v; want no request and no error", vecs, err)
	}
}
