package backend

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Names of the vLLM gauges Metrics reads. vLLM renamed the KV-cache gauge
// in V1; both are accepted.
const (
	metricKVCacheV0 = "vllm:gpu_cache_usage_perc"
	metricKVCache   = "vllm:kv_cache_usage_perc"
	metricWaiting   = "vllm:num_requests_waiting"
)

// Metrics is what a backend's /metrics says of its load, in vLLM's names.
// A value is the sum of the gauge's series (a backend exports one per
// model or engine); -1 when the backend does not export the gauge.
type Metrics struct {
	// KVCacheUsage is the share of the KV cache in use (0..1): the larger
	// of vLLM's old and new gauge where a backend exports both.
	KVCacheUsage float64
	// Waiting is how many requests wait to be scheduled.
	Waiting float64
}

// maxMetricsBytes bounds a scrape; vLLM's whole exposition is some tens
// of kilobytes.
const maxMetricsBytes = 4 << 20

// textFormat is the format asked for: the parser reads the classic text
// format, and refuses OpenMetrics' float timestamps and exemplars.
var textFormat = string(expfmt.NewFormat(expfmt.TypeTextPlain))

// Metrics scrapes the backend's /metrics. A body the Prometheus text
// parser refuses is an error as a whole: the parser stops at the first bad
// line, so what it read before may lack series of a gauge.
func (c *Client) Metrics(ctx context.Context, base string) (Metrics, error) {
	base = Base(base)
	var m Metrics
	err := c.do(ctx, http.MethodGet, base+"/metrics", http.Header{"Accept": {textFormat}}, nil, func(resp *http.Response) error {
		if resp.StatusCode != http.StatusOK {
			return statusError(resp)
		}
		var err error
		m, err = parseMetrics(io.LimitReader(resp.Body, maxMetricsBytes))
		return err
	})
	if err != nil {
		return Metrics{}, fmt.Errorf("scrape metrics of %s: %w", base, err)
	}
	return m, nil
}

func parseMetrics(r io.Reader) (Metrics, error) {
	// The format ends every line with a newline and the parser refuses a
	// last line without one; an extra empty line is harmless.
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(io.MultiReader(r, strings.NewReader("\n")))
	if err != nil {
		return Metrics{}, fmt.Errorf("parse: %w", err)
	}
	m := Metrics{KVCacheUsage: -1, Waiting: -1}
	for _, name := range []string{metricKVCacheV0, metricKVCache} {
		if v, ok := sumSeries(families[name]); ok {
			m.KVCacheUsage = max(m.KVCacheUsage, v)
		}
	}
	if v, ok := sumSeries(families[metricWaiting]); ok {
		m.Waiting = v
	}
	return m, nil
}

// sumSeries adds up the values of a family's series; false when it has
// no series with a single value (a missing family, or a histogram or
// summary of that name).
func sumSeries(f *dto.MetricFamily) (sum float64, ok bool) {
	for _, s := range f.GetMetric() {
		switch {
		case s.Gauge != nil:
			sum += s.Gauge.GetValue()
		case s.Untyped != nil:
			sum += s.Untyped.GetValue()
		case s.Counter != nil:
			sum += s.Counter.GetValue()
		default:
			continue
		}
		ok = true
	}
	return sum, ok
}
