// Package integration runs Sluice end to end against a real Temporal dev
// server, a real redis-server and the LLM simulator: HTTP in, SSE out.
package integration

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/files"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/sqldb"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
)

// stack is the running system under test, shared by the package's tests,
// which run one at a time because they share the pools' permits.
var stack struct {
	cfg     config.Config
	baseURL string
	// metricsURL is the API's /metrics on metrics.addr, off the public
	// port: the one that has the series naming tenants.
	metricsURL string
	temporal   client.Client
	redis      *redis.Client
	gate       *admission.Gate
	// sim is the LLM simulator behind both pools; its Stats show what
	// Sluice sends it.
	sim *llmsim.Server
	// simURL is the simulator's address, for asking it directly what
	// Sluice forwards.
	simURL string
	// usagePath is the usage ledger's SQLite file.
	usagePath string
	// files is the stack's file store, opened beside the API's, for what
	// a test must find stored (or not).
	files *files.Store
}

const keyPrefix = "it:"

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("integration tests skipped in -short mode")
		os.Exit(0)
	}
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration setup:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	rds, err := testenv.LaunchRedis()
	if err != nil {
		return 0, err
	}
	defer rds.Stop()
	ts, err := testenv.LaunchTemporal(ctx, workflows.SearchAttributeNames)
	if err != nil {
		return 0, err
	}
	defer func() { _ = ts.Stop() }()

	simCfg := llmsim.DefaultConfig()
	simCfg.TimeScale = 0.5
	simCfg.AnswerMinTokens, simCfg.AnswerMaxTokens = 150, 300
	sim, err := llmsim.New(simCfg, nil)
	if err != nil {
		return 0, err
	}
	defer sim.Close()
	stack.sim = sim
	simSrv := httptest.NewServer(sim.Handler())
	defer simSrv.Close()
	stack.simURL = simSrv.URL

	cfg := config.Default()
	cfg.API.Addr = "127.0.0.1:0"
	cfg.API.DisconnectGrace = time.Second
	cfg.API.QueuePollInterval = 200 * time.Millisecond
	// Under -race on a shared 2-core machine a Redis round trip at the
	// door can take longer than the production bound of 1 s, which would
	// refuse bursts with 503 for the machine's sake; the bound itself is
	// tested on its own (api's TestStalledRedisIs503InBoundedTime).
	cfg.Redis.RequestTimeout = 5 * time.Second
	cfg.Temporal.HostPort = ts.FrontendHostPort()
	cfg.Redis.Addr = rds.Addr
	cfg.Redis.KeyPrefix = keyPrefix
	cfg.Admission.MaxWait = 4 * time.Second
	cfg.Admission.RecheckInterval = time.Second
	cfg.Pools.Short.Endpoints = []string{simSrv.URL}
	cfg.Pools.Long.Endpoints = []string{simSrv.URL}
	cfg.Pools.Short.MaxConcurrency = 2
	// Both pools name the simulator: one budget of 4 permits, small enough
	// that the pools' tests contend for it (pools_test.go).
	cfg.Pools.Long.MaxConcurrency = 4
	cfg.Pools.Shared.MaxConcurrency = 4
	// The long pool continues answers, so that a flex stream on it may be
	// paused for a more urgent request (preempt_test.go); the short pool
	// does not, so that the queue tests on it see no pause.
	cfg.Pools.Long.Continuation = config.ContinuationVLLM
	cfg.Admission.Preemption.Enabled = true
	cfg.Log.Level = "warn"
	metricsPort, err := testenv.FreePort()
	if err != nil {
		return 0, err
	}
	cfg.Metrics.Addr = fmt.Sprintf("127.0.0.1:%d", metricsPort)
	// Answers of the anonymous tenant's it-cached, and of two tenants'
	// kbs of one name (each its own).
	cfg.AnswerCache.KBs = []string{"anonymous/it-cached", "it-acme/it-faq", "it-globex/it-faq"}
	// The healer would act on what other tests do to the pools (a queue
	// timeout test is a 100% timeout rate); TestHealingThroughTemporal
	// starts one of its own.
	cfg.Healing.Enabled = false
	// The burst and fairness tests send hundreds of requests with one key.
	cfg.Limits.Ban.Enabled = false
	cfg.Auth.APIKeys = []config.APIKey{
		{Key: "k-acme", Tenant: "acme", User: "alice"},
		{Key: "k-slow", Tenant: "slowco", User: "sam", Tier: "slow"},
		{Key: "k-burst", Tenant: "burstco", User: "bo", Tier: "burst"},
		{Key: "k-fair-vip", Tenant: "fair-vip", Tier: "fair-vip"},
		{Key: "k-fair-std", Tenant: "fair-std", Tier: "fair-std"},
		{Key: "k-fair-free", Tenant: "fair-free", Tier: "fair-free"},
		{Key: "k-pool-long", Tenant: "pool-long", Tier: "burst"},
		{Key: "k-pool-short", Tenant: "pool-short", Tier: "burst"},
		{Key: "k-deadline", Tenant: "deadline-co", Tier: "deadline"},
		// Two users of one tenant and one of another, for tenancy_test.go.
		{Key: keyAlice, Tenant: "it-acme", User: "alice", Tier: "burst", Scopes: []string{"chat", "ingest"}},
		{Key: keyBob, Tenant: "it-acme", User: "bob", Tier: "burst", Scopes: []string{"chat", "ingest"}},
		{Key: keyGus, Tenant: "it-globex", User: "gus", Tier: "burst", Scopes: []string{"chat", "ingest"}},
		// Tenants with monthly budgets, for budget_test.go.
		{Key: keyMetered, Tenant: "it-metered", User: "mia", Tier: "metered"},
		{Key: keyBroke, Tenant: "it-broke", User: "bo", Tier: "broke"},
	}
	// A tier whose token bucket barely refills, so a test can read what a
	// finished request left charged.
	cfg.Limits.Tiers["slow"] = policy.Tier{Weight: 1, Tenant: policy.Rate{TokensPerMinute: 60, TokenBurst: 100000}}
	// Tiers without rate limits and with a long queue wait, for tests that
	// push many requests through the queue: what they measure is the
	// queue, not the rate limits or the 4 s default wait.
	cfg.Limits.Tiers["burst"] = policy.Tier{Weight: 3, MaxWait: 45 * time.Second}
	cfg.Limits.Tiers["fair-vip"] = policy.Tier{Weight: 5, MaxWait: 45 * time.Second}
	cfg.Limits.Tiers["fair-std"] = policy.Tier{Weight: 3, MaxWait: 45 * time.Second}
	cfg.Limits.Tiers["fair-free"] = policy.Tier{Weight: 2, MaxWait: 45 * time.Second}
	// A tier whose one class refuses requests that cannot get a permit
	// within its 3 s deadline, well before the tier's max wait.
	cfg.Limits.Tiers["deadline"] = policy.Tier{Weight: 3, MaxWait: 45 * time.Second,
		Classes: map[string]policy.ClassLimits{request.ClassDefault: {Weight: 3, TTFTSLO: 3 * time.Second, RefuseLate: true}}}
	cfg.Limits.Tiers["metered"] = policy.Tier{Weight: 3, MaxWait: 45 * time.Second,
		Budget: policy.Budget{TokensPerMonth: 1_000_000, SpendPerMonthUSD: 100}}
	cfg.Limits.Tiers["broke"] = policy.Tier{Weight: 1, Budget: policy.Budget{TokensPerMonth: 10}, FileQuota: policy.FileQuota{Bytes: 2048}}
	cfg.Prices = config.Prices{}
	for _, p := range cfg.Pools.ByName() {
		cfg.Prices[p.Model] = itPrice
	}
	// Every request is recorded in the usage ledger, as with make run.
	usageDir, err := os.MkdirTemp("", "sluice-it-usage-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(usageDir)
	stack.usagePath = filepath.Join(usageDir, "usage.db")
	cfg.Usage = config.Usage{Database: config.Database{Store: config.UsageSQLite, SQLitePath: stack.usagePath}}
	cfg.Responses.Database = config.Database{Store: config.StoreSQLite, SQLitePath: filepath.Join(usageDir, "responses.db")}
	cfg.Files.Database = config.Database{Store: config.StoreSQLite, SQLitePath: filepath.Join(usageDir, "files.db")}
	// Small enough for a test to pass them (openai_files_test.go).
	cfg.Files.MaxLines = 500
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	stack.cfg = cfg

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	wctx, cancelWait := context.WithTimeout(ctx, time.Minute)
	api, err := app.StartAPI(wctx, cfg, logger)
	cancelWait()
	if err != nil {
		return 0, err
	}
	stack.baseURL = api.URL
	stack.metricsURL = "http://" + cfg.Metrics.Addr + "/metrics"

	stack.temporal = ts.Client()
	stack.redis = redis.NewClient(&redis.Options{Addr: rds.Addr})
	defer stack.redis.Close()
	// The stack's own gate: the worker's keys and groups.
	gopts := app.GateOptions(cfg)
	gopts.KeyPrefix, gopts.WaiterTTL = keyPrefix, time.Minute
	stack.gate, err = admission.New(stack.redis, gopts)
	if err != nil {
		return 0, err
	}

	stack.files, err = files.OpenSQLite(ctx, sqldb.SQLiteOptions{Path: cfg.Files.SQLitePath})
	if err != nil {
		return 0, err
	}
	defer stack.files.Close()

	code := m.Run()
	if err := api.Stop(20 * time.Second); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return code, nil
}
