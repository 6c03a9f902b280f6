package scaler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// SimulatorOptions configures a Simulator.
type SimulatorOptions struct {
	// URL is the simulator's base URL, such as http://127.0.0.1:8090.
	URL string
	// Client sends the requests; nil means a plain http.Client.
	Client *http.Client
	// Timeout bounds each call; zero means DefaultTimeout.
	Timeout time.Duration
	// Logger records scale requests; nil discards.
	Logger *slog.Logger
}

// Simulator scales Sluice's LLM simulator (pkg/llmsim) through
// GET and POST /admin/config. The simulator accepts 1 to llmsim.MaxReplicas
// replicas and answers other counts with 400, reported as ErrInvalid.
type Simulator struct {
	config string // the /admin/config URL
	ep     endpoint
	log    *slog.Logger
}

var _ Scaler = (*Simulator)(nil)

// NewSimulator checks the options.
func NewSimulator(o SimulatorOptions) (*Simulator, error) {
	base, err := parseBaseURL(o.URL)
	if err != nil {
		return nil, fmt.Errorf("simulator scaler: %w", err)
	}
	return &Simulator{
		config: base + "/admin/config",
		ep:     newEndpoint(o.Client, o.Timeout),
		log:    orDiscard(o.Logger),
	}, nil
}

// simConfig is the part of llmsim's RuntimeConfig the scaler reads; the
// package does not import llmsim, which would pull a tokenizer into every
// binary that only wants to scale.
type simConfig struct {
	Replicas         *int `json:"replicas"`
	DrainingReplicas int  `json:"draining_replicas"`
}

func (c simConfig) count() (Count, error) {
	if c.Replicas == nil {
		return Count{}, errors.New("answer has no replicas field")
	}
	// Draining replicas still serve what they hold; the pool has not
	// settled until they are gone.
	return Count{Desired: *c.Replicas, Current: *c.Replicas + c.DrainingReplicas}, nil
}

// Replicas reads the active (Desired) and active plus draining (Current)
// replicas.
func (s *Simulator) Replicas(ctx context.Context) (Count, error) {
	var c simConfig
	if err := s.ep.call(ctx, http.MethodGet, s.config, jsonAccept(), nil, &c); err != nil {
		return Count{}, fmt.Errorf("read simulator replicas: %w", err)
	}
	n, err := c.count()
	if err != nil {
		return Count{}, fmt.Errorf("read simulator replicas: %w", err)
	}
	return n, nil
}

// Scale sets the simulator's replica count. Extra replicas start at once
// with empty caches; removed ones drain.
func (s *Simulator) Scale(ctx context.Context, replicas int, reason string) error {
	if err := checkReplicas(replicas); err != nil {
		return fmt.Errorf("scale simulator: %w", err)
	}
	body, _ := json.Marshal(map[string]int{"replicas": replicas})
	h := jsonAccept()
	h.Set("Content-Type", "application/json")
	var c simConfig
	if err := s.ep.call(ctx, http.MethodPost, s.config, h, body, &c); err != nil {
		return fmt.Errorf("scale simulator to %d: %w", replicas, err)
	}
	s.log.InfoContext(ctx, "scaled llm simulator", "replicas", replicas, "reason", reason)
	return nil
}

func jsonAccept() http.Header {
	h := http.Header{}
	h.Set("Accept", "application/json")
	return h
}

// parseBaseURL checks that raw is an absolute http(s) URL and drops a
// trailing slash so paths can be appended.
func parseBaseURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("parse URL %q: %w", raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("URL must be absolute http(s), got %q", raw)
	}
	return strings.TrimRight(u.String(), "/"), nil
}

func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
