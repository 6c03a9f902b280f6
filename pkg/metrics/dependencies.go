package metrics

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var dependencyUpDesc = prometheus.NewDesc("sluice_dependency_up",
	"Whether this instance reached a dependency (redis, temporal) when scraped: 1 it answered, 0 it did not within the scrape budget.",
	[]string{"dependency"}, nil)

// RegisterDependency exposes whether check reaches the dependency named
// name, checked when scraped and bounded by a short timeout: the alerts
// that Redis or Temporal is down read this, the same checks as /readyz.
func (m *Metrics) RegisterDependency(name string, check func(ctx context.Context) error) {
	if m == nil {
		return
	}
	m.depsOnce.Do(func() {
		m.deps = &dependencyCollector{budget: m.scrapeBudget, logger: m.logger}
		m.reg.MustRegister(m.deps)
	})
	m.deps.add(name, check)
}

type dependencyCollector struct {
	budget time.Duration
	logger *slog.Logger
	mu     sync.Mutex
	names  []string
	checks []func(ctx context.Context) error
	last   snapshot
}

func (c *dependencyCollector) add(name string, check func(ctx context.Context) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.names = append(c.names, name)
	c.checks = append(c.checks, check)
}

func (c *dependencyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- dependencyUpDesc }

// Collect checks every dependency at once, so that one that hangs costs
// the scrape one budget, not one per dependency; scrapes within
// snapshotTTL of a check see its result.
func (c *dependencyCollector) Collect(ch chan<- prometheus.Metric) { c.last.collect(ch, c.check) }

func (c *dependencyCollector) check(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	names, checks := c.names, c.checks
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.budget)
	defer cancel()
	var wg sync.WaitGroup
	for i, check := range checks {
		wg.Go(func() {
			up := 1.0
			if err := check(ctx); err != nil {
				c.logger.Warn("metrics: dependency check", "dependency", names[i], "err", err)
				up = 0
			}
			ch <- prometheus.MustNewConstMetric(dependencyUpDesc, prometheus.GaugeValue, up, names[i])
		})
	}
	wg.Wait()
}
