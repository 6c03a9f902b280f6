// Package stack starts what a scenario runs against (redis-server, the
// Temporal dev server, the LLM simulator and Sluice's API with its
// embedded worker, in the bench's process or as processes of their
// own), gives the bench its clients to it, and reads what a run left
// behind in it.
package stack

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/testsuite"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
)

// Options says what a scenario needs running.
type Options struct {
	// RedisOnly starts redis-server and nothing else.
	RedisOnly bool
	// Simulator adjusts the LLM simulator's configuration, which starts
	// from llmsim.DefaultConfig().
	Simulator func(sim *llmsim.Config)
	// Configure adjusts Sluice's configuration before the API starts; it
	// starts from config.Default() pointed at the launched servers.
	Configure func(cfg *config.Config)
	// Processes runs the API (with its embedded worker) and a worker as
	// OS processes of their own, built from this checkout, on a Temporal
	// dev server that keeps its state in a file, as make run does
	// (processes.go); otherwise the API runs in the bench's process.
	Processes bool
	// Quiet discards the API's logs; otherwise warnings and errors go to stderr, the
	// first few of each kind in full and a count of all at the end.
	Quiet bool
}

// Stack is a running Sluice with everything it depends on, and the
// bench's own clients to it.
type Stack struct {
	Config config.Config
	Redis  *testenv.Redis
	// The rest is nil with RedisOnly.
	temporal *testsuite.DevServer
	// temporalHostPort is the dev server's frontend.
	temporalHostPort string
	// Procs are the API and worker processes with Processes, else nil.
	Procs   *Processes
	Sim     *llmsim.Server
	SimURL  string
	BaseURL string
	// Core is a second core built as the API process builds its own, with
	// no loop running: the bench's Redis and Temporal clients, gate and
	// limiter.
	Core *app.Core

	logs    *logCounter
	api     *app.API
	closers []func()
}

// Launch starts redis-server and, unless opts.RedisOnly, the Temporal
// dev server, the simulator and a full API process (app.RunAPI, with
// its embedded worker) in this process. Close stops them all.
func Launch(ctx context.Context, opts Options) (*Stack, error) {
	s := &Stack{}
	if err := s.launch(ctx, opts); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Stack) launch(ctx context.Context, opts Options) error {
	rds, err := testenv.LaunchRedis()
	if err != nil {
		return err
	}
	s.Redis = rds
	s.closers = append(s.closers, rds.Stop)
	s.Config = config.Default()
	s.Config.Redis.Addr = rds.Addr
	// The scenarios flood with a few keys on purpose; abuse bans would
	// end them after 50 requests.
	s.Config.Limits.Ban.Enabled = false
	if opts.RedisOnly {
		return nil
	}
	if err := s.launchServers(ctx, opts); err != nil {
		return err
	}
	cfg := s.Config
	cfg.API.Addr = "127.0.0.1:0"
	cfg.Temporal.HostPort = s.temporalHostPort
	cfg.Pools.Short.Endpoints = []string{s.SimURL}
	cfg.Pools.Long.Endpoints = []string{s.SimURL}
	cfg.Log.Level = "error"
	if opts.Configure != nil {
		opts.Configure(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	s.Config = cfg
	logger := s.logger(opts.Quiet)
	if opts.Processes {
		err = s.startProcesses(ctx)
	} else {
		err = s.startAPI(ctx, logger)
	}
	if err != nil {
		return err
	}
	s.Core, err = app.Build(ctx, cfg, logger)
	return err
}

// launchServers starts the Temporal dev server and the simulator.
func (s *Stack) launchServers(ctx context.Context, opts Options) error {
	if err := s.launchTemporal(ctx, opts.Processes); err != nil {
		return err
	}
	simCfg := llmsim.DefaultConfig()
	if opts.Simulator != nil {
		opts.Simulator(&simCfg)
	}
	sim, err := llmsim.New(simCfg, nil)
	if err != nil {
		return err
	}
	s.Sim = sim
	s.closers = append(s.closers, sim.Close)
	simSrv := httptest.NewServer(sim.Handler())
	s.SimURL = simSrv.URL
	s.closers = append(s.closers, simSrv.Close)
	return nil
}

// launchTemporal starts the dev server: in memory, or, with inFile, with
// its state in a file as make run keeps it, so that its memory is what a
// long run of make run's would hold.
func (s *Stack) launchTemporal(ctx context.Context, inFile bool) error {
	if !inFile {
		ts, err := testenv.LaunchTemporal(ctx, workflows.SearchAttributeNames)
		if err != nil {
			return err
		}
		s.temporal, s.temporalHostPort = ts, ts.FrontendHostPort()
		s.closers = append(s.closers, func() { _ = ts.Stop() })
		return nil
	}
	dir, err := os.MkdirTemp("", "sluice-bench-temporal-")
	if err != nil {
		return fmt.Errorf("directory for the dev server's database: %w", err)
	}
	s.closers = append(s.closers, func() { os.RemoveAll(dir) })
	ts, err := testenv.LaunchPersistentTemporal(ctx, workflows.SearchAttributeNames, dir, os.Stderr)
	if err != nil {
		return err
	}
	s.temporalHostPort = ts.HostPort
	s.closers = append(s.closers, func() { _ = ts.Stop() })
	return nil
}

// logger is the API process's logger.
func (s *Stack) logger(quiet bool) *slog.Logger {
	if quiet {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s.logs = &logCounter{next: slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}), mu: &sync.Mutex{}, counts: map[string]int{}}
	return slog.New(s.logs)
}

// startAPI runs app.RunAPI until Close, and waits until it listens.
func (s *Stack) startAPI(ctx context.Context, logger *slog.Logger) error {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	api, err := app.StartAPI(wctx, s.Config, logger)
	if err != nil {
		return err
	}
	s.api, s.BaseURL = api, api.URL
	return nil
}

// Client is an HTTP client to the API keeping up to conns connections
// alive; Close closes them.
func (s *Stack) Client(conns int) *http.Client { return s.ClientFrom("", conns) }

// ClientFrom is client with its connections from the local address from
// ("": the system's choice, 127.0.0.1).
func (s *Stack) ClientFrom(from string, conns int) *http.Client {
	tr := &http.Transport{MaxIdleConns: conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: time.Minute, DisableCompression: true}
	if from != "" {
		tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 30 * time.Second}).DialContext
	}
	s.closers = append(s.closers, tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// Close stops the API process (waiting for it), then everything else in
// reverse order of starting.
func (s *Stack) Close() {
	if s.Core != nil {
		s.Core.Close()
	}
	if s.api != nil {
		if err := s.api.Stop(30 * time.Second); err != nil {
			fmt.Fprintln(os.Stderr, "sluice-bench:", err)
		}
	}
	// Whatever still runs in this process (an interrupted run's
	// goroutines) must not fill the report with redis dial errors.
	redis.SetLogger(quietRedis{})
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	if s.logs != nil {
		s.logs.summary()
	}
}

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// logCounter passes the first few records of each message to next and
// counts all of them, so that an overloaded API cannot bury the report
// under thousands of identical lines.
type logCounter struct {
	next   slog.Handler
	mu     *sync.Mutex
	counts map[string]int
}

const logFirst = 3

func (h *logCounter) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *logCounter) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	h.counts[r.Message]++
	n := h.counts[r.Message]
	h.mu.Unlock()
	if n > logFirst {
		return nil
	}
	return h.next.Handle(ctx, r)
}

func (h *logCounter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logCounter{next: h.next.WithAttrs(attrs), mu: h.mu, counts: h.counts}
}

func (h *logCounter) WithGroup(name string) slog.Handler {
	return &logCounter{next: h.next.WithGroup(name), mu: h.mu, counts: h.counts}
}

func (h *logCounter) summary() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.counts) == 0 {
		return
	}
	msgs := make([]string, 0, len(h.counts))
	for m := range h.counts {
		msgs = append(msgs, m)
	}
	sort.Slice(msgs, func(i, j int) bool { return h.counts[msgs[i]] > h.counts[msgs[j]] })
	fmt.Fprintln(os.Stderr, "sluice-bench: warnings and errors the API process logged (first few of each shown above):")
	for _, m := range msgs {
		fmt.Fprintf(os.Stderr, "  %6d × %s\n", h.counts[m], m)
	}
}
