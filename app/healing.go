package app

import (
	"fmt"
	"log/slog"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/alert"
	"github.com/sluice-dev/sluice/pkg/backend"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/pkg/scaler"
)

// newScaler builds a pool's scaler from config; nil for kind none.
func newScaler(pool string, s config.Scaler, logger *slog.Logger) (scaler.Scaler, error) {
	var sc scaler.Scaler
	var err error
	switch s.Kind {
	case config.ScalerNone:
		return nil, nil
	case config.ScalerSimulator:
		sc, err = scaler.NewSimulator(scaler.SimulatorOptions{URL: s.URL, Timeout: s.Timeout, Logger: logger})
	case config.ScalerWebhook:
		sc, err = scaler.NewWebhook(scaler.WebhookOptions{URL: s.URL, StatusURL: s.StatusURL, Pool: pool, Token: s.Token, Timeout: s.Timeout, Logger: logger})
	case config.ScalerKubernetes:
		sc, err = scaler.NewKubernetes(scaler.KubernetesOptions{APIServer: s.APIServer, Namespace: s.Namespace, Deployment: s.Deployment, Timeout: s.Timeout, Logger: logger})
	default:
		return nil, fmt.Errorf("pools.%s.scaler.kind: unknown kind %q", pool, s.Kind)
	}
	if err != nil {
		return nil, fmt.Errorf("pools.%s.scaler: %w", pool, err)
	}
	return sc, nil
}

// buildHealing wires the healer's activities from config.
func (c *Core) buildHealing() (*activities.Healing, error) {
	cfg := c.cfg
	pools := map[string]activities.HealingPool{}
	for name, p := range cfg.Pools.ByName() {
		sc, err := newScaler(name, p.Scaler, c.logger.With("component", "scaler", "pool", name))
		if err != nil {
			return nil, err
		}
		endpoints := make([]string, len(p.Endpoints))
		for i, e := range p.Endpoints {
			endpoints[i] = backend.Base(e)
		}
		hp := activities.HealingPool{
			Endpoints: endpoints, MinPermits: p.Healing.MinPermits, MaxPermits: p.MaxConcurrency,
			Scaler: sc, MinReplicas: p.Scaler.BaseReplicas, MaxReplicas: p.Scaler.MaxReplicas,
		}
		if cr, ok := c.Chat.Pools[name].Streamer.(interface{ Circuits() []llm.Circuit }); ok {
			hp.Circuits = cr.Circuits
		}
		if p.Healing.BaseBatch > 0 {
			hp.MinBatch, hp.MaxBatch = p.Healing.MinBatch, p.Healing.BaseBatch
		}
		pools[name] = hp
	}
	return &activities.Healing{
		Gate:     c.Gate,
		Latency:  c.Latency,
		Policy:   c.Policy,
		Pools:    pools,
		Notifier: c.Notifier,
		Metrics:  c.Metrics,
		Backends: backend.Client{Timeout: cfg.Healing.MetricsTimeout},
		Alerts:   alert.Webhook{URL: cfg.Healing.AlertWebhook, Timeout: cfg.Healing.AlertTimeout},
		Logger:   c.logger.With("component", "healing"),
	}, nil
}
