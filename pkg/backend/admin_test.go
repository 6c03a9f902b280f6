package backend_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-dev/sluice/pkg/backend"
	"github.com/sluice-dev/sluice/pkg/llmsim"
)

type sim struct {
	*llmsim.Server
	url   string
	posts atomic.Int32
}

// newSim serves an in-process llmsim, counting the posts it takes.
func newSim(t *testing.T) *sim {
	t.Helper()
	cfg := llmsim.DefaultConfig()
	cfg.TimeScale = 0.01
	srv, err := llmsim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	s := &sim{Server: srv}
	h := srv.Handler()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			s.posts.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	s.url = hs.URL
	return s
}

func TestSetBatchOnTheSimulator(t *testing.T) {
	s := newSim(t)
	c := &backend.Client{}
	ctx := context.Background()
	for range 2 {
		applied, err := c.SetBatch(ctx, s.url+"/v1", 4)
		if err != nil || !applied {
			t.Fatalf("set batch: %v %v, want applied", applied, err)
		}
	}
	if got := s.RuntimeConfig().MaxNumSeqs; got != 4 {
		t.Fatalf("max_num_seqs %d, want 4", got)
	}
	// The second call found 4 there and wrote nothing.
	if n := s.posts.Load(); n != 1 {
		t.Errorf("%d posts, want 1", n)
	}
	// The simulator refuses a batch of 0 with 400.
	if _, err := c.SetBatch(ctx, s.url, 0); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("refused value: %v, want the 400", err)
	}
}

func TestSetBatchWithoutAnAdminAPI(t *testing.T) {
	for _, status := range []int{http.StatusNotFound, http.StatusMethodNotAllowed} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(status)
		}))
		applied, err := (&backend.Client{}).SetBatch(context.Background(), srv.URL, 4)
		srv.Close()
		if err != nil || applied {
			t.Errorf("answer %d: %v %v, want not applied and no error", status, applied, err)
		}
	}
}

func TestSetBatchFailures(t *testing.T) {
	for name, answer := range map[string]func(http.ResponseWriter){
		"500":                func(w http.ResponseWriter) { w.WriteHeader(http.StatusInternalServerError) },
		"not JSON":           func(w http.ResponseWriter) { _, _ = w.Write([]byte("<html>")) },
		"no max_num_seqs":    func(w http.ResponseWriter) { _, _ = w.Write([]byte(`{"replicas": 1}`)) },
		"null max_num_seqs":  func(w http.ResponseWriter) { _, _ = w.Write([]byte(`{"max_num_seqs": null}`)) },
		"post answered 503s": nil,
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch {
				case answer != nil:
					answer(w)
				case r.Method == http.MethodGet:
					_, _ = w.Write([]byte(`{"max_num_seqs": 16}`))
				default:
					w.WriteHeader(http.StatusServiceUnavailable)
				}
			}))
			t.Cleanup(srv.Close)
			if applied, err := (&backend.Client{}).SetBatch(context.Background(), srv.URL, 4); err == nil || applied {
				t.Errorf("%v %v, want an error", applied, err)
			}
		})
	}
	if _, err := (&backend.Client{}).SetBatch(context.Background(), "http://127.0.0.1:1", 4); err == nil {
		t.Error("a down backend: no error")
	}
}
