package scaler_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/scaler"
)

func startSim(t *testing.T) (*llmsim.Server, string) {
	t.Helper()
	cfg := llmsim.DefaultConfig()
	cfg.TimeScale = 0.01
	sim, err := llmsim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(sim.Handler())
	t.Cleanup(ts.Close)
	t.Cleanup(sim.Close)
	return sim, ts.URL
}

func TestSimulator(t *testing.T) {
	tests := []struct {
		name      string
		run       func(ctx context.Context, s *scaler.Simulator) error
		wantErr   error
		wantMsg   string
		permanent bool
		replicas  int // active replicas of the simulator afterwards
	}{
		{
			name: "read",
			run: func(ctx context.Context, s *scaler.Simulator) error {
				c, err := s.Replicas(ctx)
				if err == nil && c != (scaler.Count{Desired: 1, Current: 1}) {
					return fmt.Errorf("count %+v", c)
				}
				return err
			},
			replicas: 1,
		},
		{
			name: "scale up",
			run: func(ctx context.Context, s *scaler.Simulator) error {
				if err := s.Scale(ctx, 3, "test"); err != nil {
					return err
				}
				c, err := s.Replicas(ctx)
				if err == nil && c != (scaler.Count{Desired: 3, Current: 3}) {
					return fmt.Errorf("count %+v", c)
				}
				return err
			},
			replicas: 3,
		},
		{
			name: "same count twice",
			run: func(ctx context.Context, s *scaler.Simulator) error {
				if err := s.Scale(ctx, 2, "retry"); err != nil {
					return err
				}
				return s.Scale(ctx, 2, "retry")
			},
			replicas: 2,
		},
		{
			name:    "zero is below the simulator's minimum",
			run:     func(ctx context.Context, s *scaler.Simulator) error { return s.Scale(ctx, 0, "") },
			wantErr: scaler.ErrInvalid, wantMsg: "400 Bad Request: invalid config update: replicas must be in 1..64, got 0",
			permanent: true, replicas: 1,
		},
		{
			name:    "negative refused before any request",
			run:     func(ctx context.Context, s *scaler.Simulator) error { return s.Scale(ctx, -3, "") },
			wantErr: scaler.ErrInvalid, wantMsg: "scale simulator: replica count refused: replicas must be >= 0, got -3",
			permanent: true, replicas: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sim, url := startSim(t)
			s, err := scaler.NewSimulator(scaler.SimulatorOptions{URL: url + "/"})
			if err != nil {
				t.Fatal(err)
			}
			checkErr(t, tt.run(context.Background(), s), tt.wantErr, tt.wantMsg, tt.permanent)
			if got := sim.RuntimeConfig().Replicas; got != tt.replicas {
				t.Errorf("simulator replicas = %d, want %d", got, tt.replicas)
			}
		})
	}
}

// While removed replicas drain, Current counts them and the pool is not
// settled.
func TestSimulatorDraining(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/admin/config" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(`{"model":"sluice-sim","replicas":2,"draining_replicas":3,"max_num_seqs":16}`))
	}))
	t.Cleanup(srv.Close)
	s, err := scaler.NewSimulator(scaler.SimulatorOptions{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Replicas(context.Background())
	if err != nil || c != (scaler.Count{Desired: 2, Current: 5}) || c.Settled() {
		t.Fatalf("Replicas = %+v, %v; want {2 5}, not settled", c, err)
	}
}

func TestSimulatorErrors(t *testing.T) {
	tests := []struct {
		name      string
		handler   http.HandlerFunc
		wantErr   error
		wantMsg   string
		permanent bool
	}{
		{"not a simulator", http.NotFound, scaler.ErrNotFound, "read simulator replicas: GET http://127.0.0.1:", true},
		{"shutting down", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":{"message":"llm simulator is shutting down","type":"server_error"}}`))
		}, nil, "503 Service Unavailable: llm simulator is shutting down", false},
		{"no replicas field", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{}`)) }, nil, "read simulator replicas: answer has no replicas field", false},
		{"not JSON", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`<html>`)) }, nil, "decode answer", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(tt.handler)
			t.Cleanup(srv.Close)
			s, err := scaler.NewSimulator(scaler.SimulatorOptions{URL: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			_, err = s.Replicas(context.Background())
			if err == nil {
				t.Fatal("no error")
			}
			if tt.wantErr == nil {
				tt.wantErr = err
			}
			checkErr(t, err, tt.wantErr, tt.wantMsg, tt.permanent)
		})
	}
}

func TestNewSimulatorRejectsBadURL(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8090", "unix:///tmp/x", "http://"} {
		if _, err := scaler.NewSimulator(scaler.SimulatorOptions{URL: u}); err == nil || !strings.HasPrefix(err.Error(), "simulator scaler: ") {
			t.Errorf("URL %q: error = %v", u, err)
		}
	}
}
