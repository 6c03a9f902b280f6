package config

import (
	"strings"
	"time"
)

// Metrics configures Prometheus metrics and the latency window that
// instances share.
type Metrics struct {
	// Addr, if set, is where the API process serves GET /metrics instead
	// of on api.addr, so that the public port need not expose it: the
	// metrics name tenants' tiers, pools and queue depths.
	Addr string `yaml:"addr"`
	// WorkerAddr is where sluice-worker serves GET /metrics ("": not at
	// all).
	WorkerAddr string `yaml:"worker_addr"`
	// LatencySlot is the time slot of the shared latency window: a reader
	// sees the last few slots. LatencyRetention is how long slots are kept.
	LatencySlot      time.Duration `yaml:"latency_slot"`
	LatencyRetention time.Duration `yaml:"latency_retention"`
}

// Log configures log/slog output.
type Log struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

func defaultMetrics() Metrics {
	return Metrics{WorkerAddr: "127.0.0.1:9091", LatencySlot: 10 * time.Second, LatencyRetention: 5 * time.Minute}
}

func defaultLog() Log {
	return Log{Level: "info", Format: "text"}
}

func (m Metrics) validate(v *validator) {
	if m.Addr != "" {
		v.hostPort("metrics.addr", m.Addr)
	}
	v.duration("metrics.latency_slot", m.LatencySlot)
	if m.LatencyRetention < m.LatencySlot {
		v.add("metrics.latency_retention", "must be at least metrics.latency_slot (%s), got %s", m.LatencySlot, m.LatencyRetention)
	}
}

func (l Log) validate(v *validator) {
	switch strings.ToLower(l.Level) {
	case "debug", "info", "warn", "error":
	default:
		v.add("log.level", "must be debug, info, warn or error, got %q", l.Level)
	}
	switch l.Format {
	case "text", "json":
	default:
		v.add("log.format", "must be text or json, got %q", l.Format)
	}
}
