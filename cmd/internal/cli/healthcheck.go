package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"
)

// healthcheck is `sluice healthcheck`: a probe for containers whose image
// has no curl. It GETs the URL and exits 0 on a 2xx answer, 1 on anything
// else (another status, no answer within the timeout).
func healthcheck(ctx context.Context, args []string, env Env) int {
	fs := flag.NewFlagSet("sluice healthcheck", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	url := fs.String("url", "http://127.0.0.1:8080/healthz", "the URL to GET: the API's /healthz (alive) or /readyz (ready for traffic), llmsim's /health")
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: sluice healthcheck [-url URL] [-timeout D]")
		fs.PrintDefaults()
	}
	if helpAsked(args) {
		fs.SetOutput(env.Stdout)
		fs.Usage()
		return exitOK
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(env.Stderr, "sluice healthcheck: unexpected arguments %v\n", fs.Args())
		return exitUsage
	}
	if err := probe(ctx, *url, *timeout); err != nil {
		fmt.Fprintln(env.Stderr, "sluice healthcheck:", err)
		return exitFail
	}
	return exitOK
}

// probe GETs url and says why it is not healthy, or nil.
func probe(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("build the request for %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}
