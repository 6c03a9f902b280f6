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
	// TenantSeries bounds the per-tenant service and backlog series
	// (sluice_tenant_*): at most this many tenants have series of their
	// own in each process, tenants with a backlog first, and the rest are
	// counted as tenant "_other". 0 turns the per-tenant series off.
	// Prometheus keeps about 4 series per tenant, pool and tier.
	TenantSeries int `yaml:"tenant_series"`
}

// maxTenantSeries caps metrics.tenant_series: beyond it a scrape carries
// tens of thousands of series, and the fairness panel is unreadable long
// before.
const maxTenantSeries = 1000

// Log configures log/slog output.
type Log struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

func defaultMetrics() Metrics {
	return Metrics{WorkerAddr: "127.0.0.1:9091", LatencySlot: 10 * time.Second, LatencyRetention: 5 * time.Minute, TenantSeries: 20}
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
	if m.TenantSeries < 0 || m.TenantSeries > maxTenantSeries {
		v.add("metrics.tenant_series", "must be between 0 (off) and %d, got %d", maxTenantSeries, m.TenantSeries)
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
