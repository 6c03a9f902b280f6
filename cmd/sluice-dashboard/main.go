// Command sluice-dashboard writes Sluice's Grafana dashboard and draws a
// preview of it from a real Prometheus:
//
//	sluice-dashboard json [-o deploy/grafana/sluice.json]
//	sluice-dashboard preview -prometheus http://127.0.0.1:9090 -start RFC3339 -end RFC3339 [-o preview.png]
//	sluice-dashboard version
//
// The preview runs every panel's queries over the range through
// Prometheus's HTTP API and draws the panels in a grid with gonum/plot:
// the dashboard's own queries on real data, where Grafana itself cannot
// be installed. deploy/grafana/preview.sh starts a Prometheus and a
// loaded Sluice stack for it (make dashboard-preview).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/sluice-dev/sluice/deploy/grafana"
	"github.com/sluice-dev/sluice/pkg/version"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: sluice-dashboard json|preview|version [flags]")
		os.Exit(2)
	}
	if version.Asked(os.Args[1:]) {
		fmt.Println(version.Line("sluice-dashboard"))
		return
	}
	var err error
	switch os.Args[1] {
	case "json":
		err = writeJSON(os.Args[2:])
	case "preview":
		err = preview(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q (want json or preview)", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "sluice-dashboard %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func writeJSON(args []string) error {
	fs := flag.NewFlagSet("json", flag.ExitOnError)
	out := fs.String("o", "deploy/grafana/sluice.json", "where to write the dashboard")
	_ = fs.Parse(args)
	b, err := grafana.JSON()
	if err != nil {
		return err
	}
	return os.WriteFile(*out, b, 0o644)
}

func preview(args []string) error {
	fs := flag.NewFlagSet("preview", flag.ExitOnError)
	prom := fs.String("prometheus", "http://127.0.0.1:9090", "Prometheus server to query")
	start := fs.String("start", "", "start of the range, RFC 3339 (default: -last before -end)")
	end := fs.String("end", "", "end of the range, RFC 3339 (default: now)")
	last := fs.Duration("last", 10*time.Minute, "length of the range when -start is not given")
	step := fs.Duration("step", 5*time.Second, "query resolution")
	rateWindow := fs.String("rate-interval", "30s", "what $__rate_interval stands for (Grafana: at least 4 scrape intervals)")
	out := fs.String("o", "deploy/grafana/preview.png", "PNG to write")
	_ = fs.Parse(args)
	r := previewRange{step: *step, rateInterval: *rateWindow}
	var err error
	if r.end, err = parseTime(*end, time.Now()); err != nil {
		return fmt.Errorf("-end: %w", err)
	}
	if r.start, err = parseTime(*start, r.end.Add(-*last)); err != nil {
		return fmt.Errorf("-start: %w", err)
	}
	if !r.start.Before(r.end) {
		return fmt.Errorf("-start %s is not before -end %s", r.start, r.end)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	data, err := queryAll(ctx, *prom, r)
	if err != nil {
		return err
	}
	if err := drawPNG(data, r, *out); err != nil {
		return err
	}
	fmt.Printf("wrote %s: %d panels, %s to %s, from %s\n", *out, len(data.panels), r.start.Format(time.RFC3339), r.end.Format(time.RFC3339), *prom)
	return nil
}

func parseTime(s string, def time.Time) (time.Time, error) {
	if s == "" {
		return def, nil
	}
	return time.Parse(time.RFC3339, s)
}
