package multi

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	enumspb "go.temporal.io/api/enums/v1"
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

// shortLimit is the short pool's max_concurrency: small, so that forty
// requests over two APIs and two workers contend for it (the goodput
// comparison sets it to goodputPermits before the stack starts).
var shortLimit = 3

// stack is the whole deployment and the test's own clients of it.
type stack struct {
	dir      string
	cfg      config.Config
	temporal *testenv.TemporalServer
	cluster  *testenv.RedisCluster
	sims     [2]*llmsim.Server
	apis     [2]*apiProc
	workers  [2]*testenv.Process

	rdb  *redis.ClusterClient
	gate *admission.Gate
	tc   client.Client
	http *http.Client

	closers []func()
}

// launchOptions adjust the stack before it starts (the zero value: as
// the multi-instance tests run it).
type launchOptions struct {
	// simulator adjusts each simulator's configuration, which starts from
	// startSimulators's.
	simulator func(*llmsim.Config)
	// configure adjusts every process's configuration, which starts from
	// multiConfig's.
	configure func(*config.Config)
}

// launchStack starts every part; on error the caller closes what it
// returns (it may be partly started).
func launchStack(ctx context.Context, opts launchOptions) (*stack, error) {
	dir, err := os.MkdirTemp("", "sluice-multi-")
	if err != nil {
		return nil, err
	}
	s := &stack{dir: dir}
	root, err := testenv.RepoRoot()
	if err != nil {
		return s, err
	}
	apiBin, workerBin := filepath.Join(root, "bin", "sluice-api"), filepath.Join(root, "bin", "sluice-worker")
	for _, b := range []string{apiBin, workerBin} {
		if _, err := os.Stat(b); err != nil {
			return s, fmt.Errorf("%s is missing: run `make build` (make test-cluster does): %w", b, err)
		}
	}
	tlog, err := os.Create(filepath.Join(dir, "temporal-server.log"))
	if err != nil {
		return s, err
	}
	s.closers = append(s.closers, func() { _ = tlog.Close() })
	if s.temporal, err = testenv.LaunchTemporalServer(ctx, workflows.SearchAttributeNames, tlog); err != nil {
		return s, fmt.Errorf("temporal server: %w", err)
	}
	if s.cluster, err = testenv.LaunchRedisCluster(ctx); err != nil {
		return s, fmt.Errorf("redis cluster: %w", err)
	}
	urls, err := s.startSimulators(opts.simulator)
	if err != nil {
		return s, err
	}
	s.cfg = multiConfig(s.cluster.Addrs, s.temporal.HostPort, urls)
	// The usage ledger in a database of its own on the Temporal server's
	// PostgreSQL, as make run-cluster keeps it; every process writes it.
	if err := s.temporal.Postgres().CreateDatabase(ctx, "sluice_usage"); err != nil {
		return s, fmt.Errorf("usage ledger database: %w", err)
	}
	s.cfg.Usage = config.Usage{Database: config.Database{Store: config.UsagePostgres, PostgresDSN: s.temporal.Postgres().DSN("sluice_usage")}}
	if err := watchLedgerAttempts(ctx, s.cfg.Usage.PostgresDSN); err != nil {
		return s, fmt.Errorf("usage ledger database: %w", err)
	}
	// Stored responses likewise, so that any API reads what another
	// created (background_test.go).
	if err := s.temporal.Postgres().CreateDatabase(ctx, "sluice_responses"); err != nil {
		return s, fmt.Errorf("responses database: %w", err)
	}
	s.cfg.Responses.Database = config.Database{Store: config.StorePostgres, PostgresDSN: s.temporal.Postgres().DSN("sluice_responses")}
	if opts.configure != nil {
		opts.configure(&s.cfg)
	}
	if err := s.cfg.Validate(); err != nil {
		return s, err
	}
	if err := s.connect(ctx); err != nil {
		return s, err
	}
	for i := range s.workers {
		p, err := testenv.NewProcess(dir, fmt.Sprintf("worker%d", i+1), workerBin, s.cfg)
		if err != nil {
			return s, err
		}
		s.workers[i] = p
		if err := p.Start(); err != nil {
			return s, err
		}
	}
	for i := range s.apis {
		cfg := s.cfg
		if cfg.API.Addr, err = freeAddr(); err != nil {
			return s, err
		}
		p, err := testenv.NewProcess(dir, fmt.Sprintf("api%d", i+1), apiBin, cfg)
		if err != nil {
			return s, err
		}
		s.apis[i] = &apiProc{Process: p, url: "http://" + cfg.API.Addr}
		if err := p.Start(); err != nil {
			return s, err
		}
	}
	for _, a := range s.apis {
		if err := s.waitAnswered(ctx, a); err != nil {
			return s, err
		}
	}
	return s, nil
}

// multiConfig is the configuration of every process: no worker inside an
// API process (killing an API must not kill activities), deadlines short
// enough that a dead process is noticed within seconds, and rate limits
// too generous to refuse anything.
func multiConfig(redisAddrs []string, temporalHostPort string, simURLs []string) config.Config {
	cfg := config.Default()
	cfg.Redis.Addr = ""
	cfg.Redis.Addrs = redisAddrs
	cfg.Temporal.HostPort = temporalHostPort
	cfg.API.EmbeddedWorker = false
	// Eager start hands the first workflow task to a worker in the API
	// process; there is none.
	cfg.Temporal.EagerStart = false
	cfg.API.DisconnectGrace = 5 * time.Second
	cfg.API.QueuePollInterval = 200 * time.Millisecond
	cfg.API.MaxConnsPerIP = 4096
	cfg.API.MaxConns = 8192
	cfg.Admission.MaxWait = 45 * time.Second
	// A killed worker's permits come back within a lease.
	cfg.Admission.Lease = 5 * time.Second
	cfg.Pools.Short.MaxConcurrency = shortLimit
	cfg.Pools.Long.MaxConcurrency = 2
	for _, p := range []*config.Pool{&cfg.Pools.Short, &cfg.Pools.Long} {
		p.Endpoints = simURLs
		p.MaxWait = 45 * time.Second
		p.ConnectTimeout = time.Second
		p.FirstTokenTimeout = 5 * time.Second
		p.TokenIdleTimeout = 3 * time.Second
		p.Breaker.SlowFirstToken = 2 * time.Second
		// The simulator continues an answer as vLLM does, so that one
		// whose worker was killed goes on where it stopped
		// (background_test.go) rather than end interrupted.
		p.Continuation = config.ContinuationVLLM
	}
	cfg.LLM.HeartbeatTimeout = 4 * time.Second
	cfg.LLM.Timeout = time.Minute
	cfg.Healing.Enabled = false
	// Two workers on one machine: neither serves metrics on a port.
	cfg.Metrics.WorkerAddr = ""
	cfg.Log.Level = "warn"
	// Buckets too big to refuse anything and refilling so slowly (one
	// token a thousand minutes) that what a tenant's bucket lacks after a
	// run is what its requests were billed (settle.Accounts).
	rate := policy.Rate{TokensPerMinute: refillPerMinute, TokenBurst: tokenCapacity, RequestsPerMinute: refillPerMinute, RequestBurst: requestCapacity}
	cfg.Limits.Tiers[tierName] = policy.Tier{Weight: 3, MaxWait: 45 * time.Second, Tenant: rate}
	cfg.Auth.APIKeys = nil
	for i := range keyCount {
		cfg.Auth.APIKeys = append(cfg.Auth.APIKeys, config.APIKey{Key: apiKey(i), Tenant: tenant, User: apiKey(i), Tier: tierName})
	}
	// Three tenants on tiers weighted 5:3:2, one tier each.
	for _, f := range fairTenants {
		cfg.Limits.Tiers[f.name] = policy.Tier{Weight: f.weight, MaxWait: 45 * time.Second, Tenant: rate}
		for i := range keyCount {
			k := f.key(i)
			cfg.Auth.APIKeys = append(cfg.Auth.APIKeys, config.APIKey{Key: k, Tenant: f.name, User: k, Tier: f.name})
		}
	}
	return cfg
}

// fairTenant is a tenant of the fairness test, alone on its tier.
type fairTenant struct {
	name   string
	weight int
}

var fairTenants = []fairTenant{{"fair-5", 5}, {"fair-3", 3}, {"fair-2", 2}}

func (f fairTenant) key(i int) string { return fmt.Sprintf("k-%s-%d", f.name, i%keyCount) }

// tenantOfKey is the fair tenant whose key k is ("" for none).
func tenantOfKey(k string) string {
	for _, f := range fairTenants {
		if strings.HasPrefix(k, "k-"+f.name+"-") {
			return f.name
		}
	}
	return ""
}

// Bucket sizes and refill of every tier (see multiConfig).
const (
	tokenCapacity   = 1e9
	requestCapacity = 1e6
	refillPerMinute = 0.001
)

const (
	tenant   = "multi"
	tierName = "multi"
	// keyCount: requests take turns among this many keys, so that no key
	// reaches a per-key abuse limit.
	keyCount = 32
)

func apiKey(i int) string { return fmt.Sprintf("k-multi-%d", i%keyCount) }

var keyTurn atomic.Int64

// nextKey is the multi tenant's next API key in turn.
func nextKey() string { return apiKey(int(keyTurn.Add(1))) }

// send makes one chat request through api (q.Key "": with the multi
// tenant's next key) and reads its stream to the end.
func (s *stack) send(ctx context.Context, api *apiProc, q chatclient.Request) *chatclient.Result {
	if q.Key == "" {
		q.Key = nextKey()
	}
	return chatclient.Send(ctx, s.http, api.url, q)
}

// closedLoop starts clients that each send q through the APIs in turn,
// with the multi tenant's keys, as soon as their last request ended.
func (s *stack) closedLoop(clients int, q chatclient.Request) *chatclient.Load {
	return chatclient.StartLoad(s.http, clients, func(c, n int) (string, string) {
		return s.apis[(c+n)%len(s.apis)].url, nextKey()
	}, q)
}

// startSimulators starts two simulator endpoints in this process:
// real-time decoding (about 60 tokens a second per sequence), answers of
// 300 to 400 tokens unless max_tokens cuts them; adjust, if set, changes
// each one's configuration.
func (s *stack) startSimulators(adjust func(*llmsim.Config)) ([]string, error) {
	urls := make([]string, len(s.sims))
	for i := range s.sims {
		c := llmsim.DefaultConfig()
		c.AnswerMinTokens, c.AnswerMaxTokens = 300, 400
		c.Seed = int64(i + 1)
		if adjust != nil {
			adjust(&c)
		}
		sim, err := llmsim.New(c, nil)
		if err != nil {
			return nil, err
		}
		srv := httptest.NewServer(sim.Handler())
		s.closers = append(s.closers, func() { srv.CloseClientConnections(); srv.Close(); sim.Close() })
		s.sims[i], urls[i] = sim, srv.URL
	}
	return urls, nil
}

// connect makes the test's own clients: the cluster, the admission gate
// over it (to read permits and queues as the processes see them) and
// Temporal.
func (s *stack) connect(ctx context.Context) error {
	s.rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: s.cluster.Addrs})
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis cluster: %w", err)
	}
	gopts := app.GateOptions(s.cfg)
	gopts.WaiterTTL = time.Minute
	gate, err := admission.New(s.rdb, gopts)
	if err != nil {
		return err
	}
	s.gate = gate
	tc, err := client.DialContext(ctx, client.Options{HostPort: s.temporal.HostPort, Namespace: s.cfg.Temporal.Namespace, Logger: testenv.QuietLogger{}})
	if err != nil {
		return fmt.Errorf("dial temporal: %w", err)
	}
	s.tc = tc
	s.http = &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, DisableCompression: true}}
	return nil
}

// waitAnswered waits until the API answers a small request to the end:
// it listens, and a worker polls.
func (s *stack) waitAnswered(ctx context.Context, api *apiProc) error {
	for {
		r := s.send(ctx, api, chatclient.Request{MaxTokens: 4, Bound: 20 * time.Second})
		if r.Terminal == "done" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not answering: last request %s", api.Name, r.Summary())
		case <-api.Exited():
			return fmt.Errorf("%s exited: %s", api.Name, testenv.Tail(api.LogPath, 20))
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// close stops every process and server; failed shows the ends of the
// processes' logs.
func (s *stack) close(failed bool) {
	procs := s.processes()
	for _, p := range procs {
		p.Stop()
	}
	if failed {
		for _, p := range procs {
			fmt.Fprintf(os.Stderr, "--- last lines of %s:\n%s\n", p.LogPath, testenv.Tail(p.LogPath, 40))
		}
		fmt.Fprintf(os.Stderr, "--- last lines of temporal-server.log:\n%s\n", testenv.Tail(filepath.Join(s.dir, "temporal-server.log"), 5))
	}
	if s.tc != nil {
		s.tc.Close()
	}
	if s.rdb != nil {
		_ = s.rdb.Close()
	}
	if s.temporal != nil {
		if err := s.temporal.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	for _, c := range s.closers {
		c()
	}
	if s.cluster != nil {
		s.cluster.Stop()
	}
	if failed {
		fmt.Fprintf(os.Stderr, "--- every process's log is kept in %s\n", s.dir)
		return
	}
	_ = os.RemoveAll(s.dir)
}

// processes are the APIs and workers started so far (a stack that
// failed to start is partly started).
func (s *stack) processes() []*testenv.Process {
	var ps []*testenv.Process
	for _, a := range s.apis {
		if a != nil {
			ps = append(ps, a.Process)
		}
	}
	for _, w := range s.workers {
		if w != nil {
			ps = append(ps, w)
		}
	}
	return ps
}

// activityPollers counts the distinct identities polling the chat task
// queue for activities: two while both workers are up.
func (s *stack) activityPollers(ctx context.Context) (int, error) {
	resp, err := s.tc.DescribeTaskQueue(ctx, s.cfg.Temporal.TaskQueue, enumspb.TASK_QUEUE_TYPE_ACTIVITY)
	if err != nil {
		return 0, fmt.Errorf("describe task queue %s: %w", s.cfg.Temporal.TaskQueue, err)
	}
	ids := map[string]bool{}
	for _, p := range resp.GetPollers() {
		ids[p.GetIdentity()] = true
	}
	return len(ids), nil
}

// apiProc is a sluice-api process and the base URL it serves on (the
// same across restarts).
type apiProc struct {
	*testenv.Process
	url string
}

// restartAPI starts a killed API again on its address and waits until
// it answers.
func (s *stack) restartAPI(ctx context.Context, p *apiProc) error {
	if err := p.Start(); err != nil {
		return err
	}
	return s.waitAnswered(ctx, p)
}

// freeAddr is a loopback address with a port free right now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
