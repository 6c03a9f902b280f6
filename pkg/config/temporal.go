package config

import (
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/contrib/envconfig"
)

// Temporal says where the Temporal frontend is, how to authenticate to it
// and how workflows are started. Address, namespace, API key and TLS come
// from three layers, the first that sets a field winning: this section
// (the file or SLUICE_TEMPORAL_*), then Temporal's own TEMPORAL_*
// variables and profile file (as the temporal CLI reads them), then the
// defaults. Load resolves them, so that after Load this section says what
// Sluice connects to.
type Temporal struct {
	// HostPort is the frontend's host:port (TEMPORAL_ADDRESS; default
	// 127.0.0.1:7233). Temporal Cloud: <namespace>.<account>.tmprl.cloud:7233
	// with mTLS, or <region>.<cloud>.api.temporal.io:7233 with an API key.
	HostPort string `yaml:"host_port"`
	// Namespace (TEMPORAL_NAMESPACE; default "default").
	Namespace string `yaml:"namespace"`
	// APIKey authenticates as a bearer token (TEMPORAL_API_KEY), and turns
	// TLS on unless temporal.tls.enabled is false.
	APIKey string `yaml:"api_key"`
	// TLS of the connection (TEMPORAL_TLS, TEMPORAL_TLS_*).
	TLS TLS `yaml:"tls"`
	// TaskQueue carries chat workflows and their activities.
	TaskQueue string `yaml:"task_queue"`
	// EagerStart asks the server to hand the first workflow task to the
	// starting process's own worker (needs system.enableEagerWorkflowStart).
	EagerStart bool `yaml:"eager_start"`
	// SearchAttributes enables upserting Sluice's custom search attributes;
	// the server must have them registered (make run and the tests do).
	SearchAttributes bool `yaml:"search_attributes"`
	// MaxConcurrentActivities bounds regular activities (LLM streams) per worker.
	MaxConcurrentActivities int `yaml:"max_concurrent_activities"`
	// MaxConcurrentWorkflowTasks bounds workflow tasks per worker.
	MaxConcurrentWorkflowTasks int `yaml:"max_concurrent_workflow_tasks"`
	// WorkerStopTimeout is how long a stopping worker lets its running
	// activities (LLM streams) finish before cancelling them. A stream cut
	// off is lost like a crashed worker's, so a deployment that must not
	// cut answers sets it above llm.timeout and gives the process as long
	// to exit (the Helm chart derives both).
	WorkerStopTimeout time.Duration `yaml:"worker_stop_timeout"`
	// WorkflowCacheSize is how many workflows a process keeps in memory
	// between their workflow tasks (the Temporal SDK's sticky cache, one
	// for every worker in the process). A workflow whose later tasks ran
	// on another worker stays here until pushed out, so this bounds what
	// the cache holds: each entry is the workflow's state and its parked
	// goroutines. A workflow not cached is replayed from its history at
	// its next task, which is slower but correct. 0 derives it from the
	// pools (Config.WorkflowCacheSize).
	WorkflowCacheSize int `yaml:"workflow_cache_size"`
}

// MinWorkflowCacheSize is the least workflow cache the pools derive.
const MinWorkflowCacheSize = 256

const (
	defaultTemporalHostPort  = "127.0.0.1:7233"
	defaultTemporalNamespace = "default"
)

func defaultTemporal() Temporal {
	return Temporal{
		HostPort:                   defaultTemporalHostPort,
		Namespace:                  defaultTemporalNamespace,
		TaskQueue:                  "sluice-chat",
		EagerStart:                 true,
		SearchAttributes:           true,
		MaxConcurrentActivities:    1000,
		MaxConcurrentWorkflowTasks: 100,
		WorkerStopTimeout:          10 * time.Second,
	}
}

// WorkflowCacheSize is the workflow cache of each process:
// temporal.workflow_cache_size, or, when that is 0, four workflows per
// permit of every pool and at least MinWorkflowCacheSize. The workflows
// a process needs cached are those it runs at once — at most a pool's
// permits streaming and about as many queued behind them, since the door
// starts no more — and the rest holds workflows that finished on other
// workers until newer ones push them out.
func (c Config) WorkflowCacheSize() int {
	if n := c.Temporal.WorkflowCacheSize; n > 0 {
		return n
	}
	permits := 0
	for _, p := range c.Pools.ByName() {
		permits += p.MaxConcurrency
	}
	return max(MinWorkflowCacheSize, 4*permits)
}

// UsesTLS reports whether the connection to Temporal uses TLS.
func (t Temporal) UsesTLS() bool {
	return t.TLS.On(t.APIKey != "")
}

// resolve fills what this section leaves unset from Temporal's profile and
// TEMPORAL_* variables in environ, then from the defaults. The profile file
// is $TEMPORAL_CONFIG_FILE, else the temporal CLI's (temporalio/temporal.toml
// in the user's config directory) when environ has a home directory;
// $TEMPORAL_PROFILE picks the profile (default "default").
func (t *Temporal) resolve(environ []string) error {
	env := envList(environ)
	_, named := env.LookupEnv("TEMPORAL_CONFIG_FILE")
	_, home := env.LookupEnv("HOME")
	_, xdg := env.LookupEnv("XDG_CONFIG_HOME")
	prof, err := envconfig.LoadClientConfigProfile(envconfig.LoadClientConfigProfileOptions{
		// Without a home there is no default profile file to look at
		// (and a test's environ does not read the developer's).
		DisableFile: !named && !home && !xdg,
		EnvLookup:   env,
	})
	if err != nil {
		return fmt.Errorf("temporal: read TEMPORAL_* variables and the Temporal profile: %w", err)
	}
	if err := t.fillFrom(prof); err != nil {
		return err
	}
	if t.HostPort == "" {
		t.HostPort = defaultTemporalHostPort
	}
	if t.Namespace == "" {
		t.Namespace = defaultTemporalNamespace
	}
	return nil
}

// fillFrom copies what prof sets into the fields this section leaves unset.
func (t *Temporal) fillFrom(prof envconfig.ClientConfigProfile) error {
	// Silently dropping what Sluice cannot carry would connect otherwise
	// than the profile says.
	if len(prof.GRPCMeta) > 0 {
		return fmt.Errorf("temporal: gRPC metadata (TEMPORAL_GRPC_META_* or the profile's grpc_meta) is not supported; unset it")
	}
	if prof.Authority != "" {
		return fmt.Errorf("temporal: an :authority override (TEMPORAL_CLIENT_AUTHORITY or the profile's authority) is not supported; unset it")
	}
	t.HostPort = firstSet(t.HostPort, prof.Address)
	t.Namespace = firstSet(t.Namespace, prof.Namespace)
	t.APIKey = firstSet(t.APIKey, prof.APIKey)
	p := prof.TLS
	// An explicit enabled: false here turns TLS off, whatever the profile says.
	if p == nil || (t.TLS.Enabled != nil && !*t.TLS.Enabled) {
		return nil
	}
	if len(p.ClientCertData) > 0 || len(p.ClientKeyData) > 0 || len(p.ServerCACertData) > 0 {
		return fmt.Errorf("temporal: inline TLS data (TEMPORAL_TLS_*_DATA or the profile's *_data) is not supported; give files (TEMPORAL_TLS_*_PATH or temporal.tls.*_file)")
	}
	if t.TLS.Enabled == nil {
		t.TLS.Enabled = Bool(!p.Disabled)
	}
	if !*t.TLS.Enabled {
		return nil
	}
	t.TLS.CAFile = firstSet(t.TLS.CAFile, p.ServerCACertPath)
	if t.TLS.CertFile == "" && t.TLS.KeyFile == "" {
		t.TLS.CertFile, t.TLS.KeyFile = p.ClientCertPath, p.ClientKeyPath
	}
	t.TLS.ServerName = firstSet(t.TLS.ServerName, p.ServerName)
	t.TLS.InsecureSkipVerifyDevOnly = t.TLS.InsecureSkipVerifyDevOnly || p.DisableHostVerification
	return nil
}

func firstSet(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Validate checks this section alone, as Config.Validate does.
func (t Temporal) Validate() error {
	var v validator
	t.validate(&v)
	return v.err()
}

func (t Temporal) validate(v *validator) {
	v.nonEmpty("temporal.host_port", t.HostPort)
	v.nonEmpty("temporal.namespace", t.Namespace)
	v.nonEmpty("temporal.task_queue", t.TaskQueue)
	t.TLS.validate(v, "temporal.tls")
	v.positive("temporal.max_concurrent_activities", int64(t.MaxConcurrentActivities))
	v.positive("temporal.max_concurrent_workflow_tasks", int64(t.MaxConcurrentWorkflowTasks))
	v.duration("temporal.worker_stop_timeout", t.WorkerStopTimeout)
	if t.WorkflowCacheSize < 0 {
		v.add("temporal.workflow_cache_size", "must be >= 0 (0: derived from the pools), got %d", t.WorkflowCacheSize)
	}
}

// envList is environ (KEY=VALUE pairs) as envconfig looks variables up.
type envList []string

func (e envList) Environ() []string { return e }

func (e envList) LookupEnv(key string) (string, bool) {
	for i := len(e) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(e[i], "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}
