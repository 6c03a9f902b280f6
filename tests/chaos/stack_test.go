package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/tests/chatclient"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
)

// stackOptions says what a scenario needs running.
type stackOptions struct {
	// externalWorker runs the Temporal worker as a sluice-worker process
	// of its own (which a scenario can kill -9) instead of inside the
	// API process.
	externalWorker bool
	// simulator adjusts both LLM simulators, which start from
	// chaosSimulator.
	simulator func(*llmsim.Config)
	// configure adjusts Sluice's configuration, which starts from
	// chaosConfig.
	configure func(*config.Config)
}

// stack is a whole Sluice on loopback whose parts a scenario can break:
// a redis-server and a Temporal dev server that restart on the same port
// (the dev server with its database file), two simulator endpoints behind
// both pools, the API process in this process, and optionally the worker
// as a separate process.
type stack struct {
	t        *testing.T
	cfg      config.Config
	redis    *testenv.Redis
	temporal *testenv.Temporal
	sims     [2]*llmsim.Server
	baseURL  string
	worker   *testenv.Process

	// The test's own clients, to look at what the stack left behind.
	rdb  *redis.Client
	gate *admission.Gate
	tc   client.Client
	http *http.Client
	// keyTurn picks each request's API key in turn.
	keyTurn atomic.Int64

	apiLog string
	api    *app.API
	// closers stop the simulators, after the API.
	closers []func()
	// dir holds the dev server's database and log, removed at the end.
	dir         string
	temporalLog string
}

// Tenants of the chaos tier: the load before and during a fault, the
// requests started after it (a scenario that loses Redis checks the
// refunds of these only), and the check that the stack is up.
const (
	tenantLoad  = "load"
	tenantAfter = "after"
	tenantReady = "ready"
	tierName    = "chaos"
)

// keysPerTenant: each tenant's requests take turns among this many API
// keys, as a tenant's many users would, so that no one key sends more
// than an abuse limit's worth in a burst (the crowd sends 1,000 requests
// in 10 s).
const keysPerTenant = 64

func apiKey(tenant string, i int) string { return fmt.Sprintf("k-%s-%d", tenant, i%keysPerTenant) }

// nextKey is the tenant's next API key in turn.
func (s *stack) nextKey(tenant string) string { return apiKey(tenant, int(s.keyTurn.Add(1))) }

// send makes one chat request as tenant, with its next API key, and reads
// its stream to the end.
func (s *stack) send(ctx context.Context, tenant string, q chatclient.Request) *chatclient.Result {
	q.Key = s.nextKey(tenant)
	return chatclient.Send(ctx, s.http, s.baseURL, q)
}

// startLoad starts a closed loop of clients; tenantOf names the tenant
// of each new request (it may change mid-run).
func (s *stack) startLoad(clients int, tenantOf func() string, q chatclient.Request) *chatclient.Load {
	return chatclient.StartLoad(s.http, clients, func(int, int) (string, string) {
		return s.baseURL, s.nextKey(tenantOf())
	}, q)
}

// Bucket sizes of the chaos tier. The buckets refill so slowly (one
// token and one request per 1,000 minutes) that what a tenant's bucket
// lacks after a run is, to the token, what its requests were billed.
const (
	tokenCapacity   = 1e9
	requestCapacity = 1e6
	refillPerMinute = 0.001
)

// chaosConfig is Sluice's configuration for chaos scenarios: every
// deadline short, so that a fault is noticed and recovered from within
// seconds, and rate limits that keep exact accounts.
func chaosConfig() config.Config {
	cfg := config.Default()
	cfg.API.Addr = "127.0.0.1:0"
	cfg.API.DisconnectGrace = time.Second
	cfg.API.QueuePollInterval = 200 * time.Millisecond
	cfg.API.StreamWriteTimeout = 2 * time.Second
	cfg.API.StreamIdleTimeout = 10 * time.Second
	cfg.API.MaxConnsPerIP = 4096
	cfg.API.MaxConns = 8192
	cfg.Admission.MaxWait = 20 * time.Second
	// A killed holder's permit comes back within a lease.
	cfg.Admission.Lease = 5 * time.Second
	cfg.Pools.Short.MaxConcurrency = 6
	cfg.Pools.Long.MaxConcurrency = 2
	for _, p := range []*config.Pool{&cfg.Pools.Short, &cfg.Pools.Long} {
		p.ConnectTimeout = 500 * time.Millisecond
		p.FirstTokenTimeout = 2 * time.Second
		p.TokenIdleTimeout = 1500 * time.Millisecond
		// Open for longer than a probe of a stalled endpoint takes (the
		// first-token deadline), so that a pool down everywhere has its
		// circuits open at once and fails fast.
		p.Breaker = config.Breaker{Failures: 2, OpenFor: 5 * time.Second, SlowFirstToken: time.Second}
	}
	// Short, so that a killed worker's streams are noticed soon, but not
	// so short that a busy two-core machine misses beats.
	cfg.LLM.HeartbeatTimeout = 4 * time.Second
	cfg.LLM.Timeout = time.Minute
	cfg.Healing.Enabled = false
	cfg.Metrics.WorkerAddr = ""
	cfg.Log.Level = "warn"
	cfg.Limits.Tiers[tierName] = policy.Tier{
		Weight: 3, MaxWait: 20 * time.Second,
		Tenant: policy.Rate{
			TokensPerMinute: refillPerMinute, TokenBurst: tokenCapacity,
			RequestsPerMinute: refillPerMinute, RequestBurst: requestCapacity,
		},
	}
	cfg.Auth.APIKeys = nil
	for _, tenant := range []string{tenantLoad, tenantAfter, tenantReady} {
		for i := range keysPerTenant {
			cfg.Auth.APIKeys = append(cfg.Auth.APIKeys, config.APIKey{Key: apiKey(tenant, i), Tenant: tenant, User: apiKey(tenant, i), Tier: tierName})
		}
	}
	return cfg
}

// chaosSimulator is one simulator endpoint: real-time decoding (about 60
// tokens a second per sequence) and answers long enough to be cut.
func chaosSimulator() llmsim.Config {
	c := llmsim.DefaultConfig()
	c.AnswerMinTokens, c.AnswerMaxTokens = 60, 120
	return c
}

// startStack starts everything and stops it when the test ends.
func startStack(t *testing.T, opts stackOptions) *stack {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s := &stack{t: t}
	t.Cleanup(s.close)
	rds, err := testenv.LaunchRedis()
	if err != nil {
		t.Fatal(err)
	}
	s.redis = rds
	// Not t.TempDir: that is removed before Cleanup stops the server.
	dir, err := os.MkdirTemp("", "sluice-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	s.temporalLog = filepath.Join(dir, "temporal.log")
	tlog, err := os.Create(s.temporalLog)
	if err != nil {
		t.Fatal(err)
	}
	s.closers = append(s.closers, func() { _ = tlog.Close() })
	ts, err := testenv.LaunchPersistentTemporal(ctx, workflows.SearchAttributeNames, dir, tlog)
	if err != nil {
		t.Fatal(err)
	}
	s.temporal = ts
	urls := s.startSimulators(opts.simulator)
	cfg := chaosConfig()
	cfg.Redis.Addr = s.redis.Addr
	cfg.Temporal.HostPort = ts.HostPort
	cfg.Pools.Short.Endpoints = urls
	cfg.Pools.Long.Endpoints = urls
	if opts.externalWorker {
		// Eager start hands the first workflow task to a worker in the
		// API process; there is none.
		cfg.API.EmbeddedWorker = false
		cfg.Temporal.EagerStart = false
	}
	if opts.configure != nil {
		opts.configure(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s.cfg = cfg
	s.connect(ctx)
	if opts.externalWorker {
		s.worker = newWorkerProcess(t, cfg)
		if err := s.worker.Start(); err != nil {
			t.Fatal(err)
		}
	}
	s.startAPI(ctx)
	if err := s.waitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// startSimulators starts the two endpoints and returns their URLs.
func (s *stack) startSimulators(adjust func(*llmsim.Config)) []string {
	urls := make([]string, len(s.sims))
	for i := range s.sims {
		c := chaosSimulator()
		c.Seed = int64(i + 1)
		if adjust != nil {
			adjust(&c)
		}
		sim, err := llmsim.New(c, nil)
		if err != nil {
			s.t.Fatal(err)
		}
		srv := httptest.NewServer(sim.Handler())
		s.closers = append(s.closers, func() { srv.CloseClientConnections(); srv.Close(); sim.Close() })
		s.sims[i], urls[i] = sim, srv.URL
	}
	return urls
}

// connect makes the test's own Redis, admission and Temporal clients.
func (s *stack) connect(ctx context.Context) {
	s.rdb = redis.NewClient(&redis.Options{Addr: s.redis.Addr, MaxRetries: -1})
	gopts := app.GateOptions(s.cfg)
	gopts.WaiterTTL = time.Minute
	gate, err := admission.New(s.rdb, gopts)
	if err != nil {
		s.t.Fatal(err)
	}
	s.gate = gate
	tc, err := client.DialContext(ctx, client.Options{HostPort: s.temporal.HostPort, Namespace: s.cfg.Temporal.Namespace,
		Logger: testenv.QuietLogger{}})
	if err != nil {
		s.t.Fatalf("dial temporal: %v", err)
	}
	s.tc = tc
	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute, DisableCompression: true}
	s.http = &http.Client{Transport: tr}
}

// startAPI runs app.RunAPI in this process until the test ends; its
// log (warnings and errors) goes to a file shown when the test fails.
func (s *stack) startAPI(ctx context.Context) {
	s.apiLog = filepath.Join(s.t.TempDir(), "api.log")
	f, err := os.Create(s.apiLog)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = f.Close() })
	logger := slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelWarn}))
	api, err := app.StartAPI(ctx, s.cfg, logger)
	if err != nil {
		s.t.Fatal(err)
	}
	s.api = api
	s.baseURL = api.URL
}

// waitReady waits until a request is answered: the kb is seeded and a
// worker polls.
func (s *stack) waitReady(ctx context.Context) error {
	for {
		r := s.send(ctx, tenantReady, chatclient.Request{MaxTokens: 4, Bound: 20 * time.Second})
		if r.Terminal == "done" {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("stack not ready: last request %s", r.Summary())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// close stops the API (waiting for it), the worker and the servers; on
// failure it shows the end of the processes' logs.
func (s *stack) close() {
	if s.api != nil {
		if err := s.api.Stop(30 * time.Second); err != nil {
			s.t.Log(err)
		}
	}
	if s.worker != nil {
		s.worker.Stop()
	}
	if s.tc != nil {
		s.tc.Close()
	}
	if s.rdb != nil {
		_ = s.rdb.Close()
	}
	if s.temporal != nil {
		if err := s.temporal.Stop(); err != nil {
			s.t.Log(err)
		}
	}
	for _, c := range s.closers {
		c()
	}
	if s.redis != nil {
		s.redis.Stop()
	}
	if s.t.Failed() {
		showTail(s.t, s.apiLog, 40)
		if s.worker != nil {
			showTail(s.t, s.worker.LogPath, 40)
		}
		showTail(s.t, s.temporalLog, 20)
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

// showTail logs the last n lines of a log file (from its panic, if any).
func showTail(t *testing.T, path string, n int) {
	t.Logf("last lines of %s:\n%s", filepath.Base(path), testenv.Tail(path, n))
}
