package main

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/sluice-dev/sluice/deploy/grafana"
)

type previewRange struct {
	start, end   time.Time
	step         time.Duration
	rateInterval string
}

// series is one line of a panel: its legend and points (seconds from the
// range's start, value).
type series struct {
	name   string
	points [][2]float64
}

type panelData struct {
	row   string
	panel grafana.Panel
	lines []series
}

// mark is one annotation: when, and its title.
type mark struct {
	at    float64
	title string
}

type dashboardData struct {
	panels []panelData
	marks  []mark
}

// queryAll runs every panel's and annotation's query over the range.
func queryAll(ctx context.Context, addr string, r previewRange) (dashboardData, error) {
	c, err := api.NewClient(api.Config{Address: addr})
	if err != nil {
		return dashboardData{}, fmt.Errorf("prometheus client for %s: %w", addr, err)
	}
	prom := promv1.NewAPI(c)
	var d dashboardData
	for _, row := range grafana.Rows {
		for _, p := range row.Panels {
			pd := panelData{row: row.Title, panel: p}
			for _, t := range p.Targets {
				m, err := queryRange(ctx, prom, grafana.Scope(t.Expr), r)
				if err != nil {
					return dashboardData{}, fmt.Errorf("panel %q: %w", p.Title, err)
				}
				for _, s := range m {
					pd.lines = append(pd.lines, toSeries(s, t.Legend, r.start))
				}
			}
			d.panels = append(d.panels, pd)
		}
	}
	for _, a := range grafana.Annotations {
		m, err := queryRange(ctx, prom, grafana.Scope(a.Expr), r)
		if err != nil {
			return dashboardData{}, fmt.Errorf("annotation %q: %w", a.Name, err)
		}
		for _, s := range m {
			title := legend(a.Title, s.Metric)
			// A mark per run of steps with a value: one action, one mark.
			prev := math.Inf(-1)
			for _, v := range s.Values {
				at := v.Timestamp.Time().Sub(r.start).Seconds()
				if at-prev > 2*r.step.Seconds() {
					d.marks = append(d.marks, mark{at: at, title: title})
				}
				prev = at
			}
		}
	}
	return d, nil
}

// queryRange runs a dashboard query as Grafana would with every variable
// at All.
func queryRange(ctx context.Context, prom promv1.API, expr string, r previewRange) (model.Matrix, error) {
	q := strings.NewReplacer("$__rate_interval", r.rateInterval, "$"+grafana.VarNamespace, ".*", "$"+grafana.VarJob, ".*",
		"$"+grafana.VarPool, ".*").Replace(expr)
	v, _, _, err := prom.QueryRange(ctx, q, promv1.Range{Start: r.start, End: r.end, Step: r.step})
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", q, err)
	}
	m, ok := v.(model.Matrix)
	if !ok {
		return nil, fmt.Errorf("query %s: a %s, not a matrix", q, v.Type())
	}
	sort.Slice(m, func(i, j int) bool { return m[i].Metric.String() < m[j].Metric.String() })
	return m, nil
}

func toSeries(s *model.SampleStream, format string, start time.Time) series {
	out := series{name: legend(format, s.Metric)}
	for _, v := range s.Values {
		f := float64(v.Value)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		out.points = append(out.points, [2]float64{v.Timestamp.Time().Sub(start).Seconds(), f})
	}
	return out
}

// legend fills a Grafana legend format ({{label}}) from a series' labels.
func legend(format string, m model.Metric) string {
	out := format
	for k, v := range m {
		out = strings.ReplaceAll(out, "{{"+string(k)+"}}", string(v))
	}
	return strings.TrimSpace(out)
}
