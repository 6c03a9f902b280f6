package llmsim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sluice-dev/sluice/pkg/tokens"
)

// Server is a set of simulated replicas behind one OpenAI-compatible
// endpoint. Create it with New, serve Handler, and Close it when done.
type Server struct {
	cfg     Config // as given to New; Replicas and MaxNumSeqs live below
	log     *slog.Logger
	counter *tokens.Counter
	clock   clock
	metrics *metrics
	mux     *http.ServeMux

	maxNumSeqs atomic.Int64
	faults     atomic.Pointer[faults]
	// refused is Config.RefuseParams as it is now; replaced, never
	// changed, so requests read it without a lock.
	refused atomic.Pointer[[]string]
	// runCtx is the lifetime of the scheduler goroutines, kept so that
	// replicas added at run time share it; Close cancels it.
	runCtx context.Context
	stop   context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	active   []*replica // take new requests
	draining []*replica // finish what they hold, then stop
	nextID   int
	rr       int
	closed   bool
}

// New validates cfg, loads the tokenizer and starts cfg.Replicas schedulers.
// A nil logger discards logs.
func New(cfg Config, logger *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	counter, err := tokens.For(cfg.Encoding)
	if err != nil {
		return nil, fmt.Errorf("start llm simulator: %w", err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	s := &Server{
		cfg:     cfg,
		log:     logger,
		counter: counter,
		clock:   newScaledClock(cfg.TimeScale),
		metrics: newMetrics(cfg.Model),
		runCtx:  runCtx,
		stop:    stop,
	}
	s.maxNumSeqs.Store(int64(cfg.MaxNumSeqs))
	s.faults.Store(&faults{server: cfg.Fault})
	refused := slices.Clone(cfg.RefuseParams)
	s.refused.Store(&refused)
	s.mu.Lock()
	s.scaleLocked(cfg.Replicas)
	s.mu.Unlock()
	s.mux = s.routes()
	return s, nil
}

// Handler serves the OpenAI-compatible API, /metrics, /health and /admin/config.
func (s *Server) Handler() http.Handler { return s.mux }

// Close stops every scheduler. Requests still queued or running end with an
// error event (streams) or a 503 (non-streaming). Close is idempotent.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.stop()
	s.wg.Wait()
}

func (s *Server) limit() int { return int(s.maxNumSeqs.Load()) }

// scaleLocked starts or drains replicas until n take requests. The newest
// replicas are drained first. s.mu must be held.
func (s *Server) scaleLocked(n int) {
	for len(s.active) < n {
		id := s.nextID
		r := newReplica(id, s.cfg, s.limit, func() Fault { return s.faults.Load().of(id) }, s.clock, s.metrics, s.log)
		s.nextID++
		s.active = append(s.active, r)
		s.log.Info("replica started", "replica", r.id)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			r.run(s.runCtx)
			s.forget(r)
		}()
	}
	for len(s.active) > n {
		r := s.active[len(s.active)-1]
		s.active = s.active[:len(s.active)-1]
		s.draining = append(s.draining, r)
		s.log.Info("replica draining", "replica", r.id)
		r.drain()
	}
}

// forget drops a replica whose scheduler has exited, and its fault.
func (s *Server) forget(r *replica) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.draining = slices.DeleteFunc(s.draining, func(x *replica) bool { return x == r })
	s.active = slices.DeleteFunc(s.active, func(x *replica) bool { return x == r })
	if cur := s.faults.Load(); len(cur.replicas) > 0 {
		next := &faults{server: cur.server, replicas: maps.Clone(cur.replicas)}
		delete(next.replicas, r.id)
		s.faults.Store(next)
	}
}

// submit hands a request's sequences to the least-loaded active replica;
// ties go round robin so that an idle fleet still spreads requests.
func (s *Server) submit(seqs []*sequence) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errServerClosed
	}
	n := len(s.active)
	if n == 0 {
		return errServerClosed
	}
	s.rr = (s.rr + 1) % n
	best, bestLoad := -1, 0
	for k := range n {
		i := (s.rr + k) % n
		if l := s.active[i].load(); best < 0 || l < bestLoad {
			best, bestLoad = i, l
		}
	}
	r := s.active[best]
	if f := s.faults.Load().of(r.id); f.ErrorStatus != 0 {
		return &faultStatus{replica: r.id, status: f.ErrorStatus}
	}
	if err := r.submit(seqs); err != nil {
		return fmt.Errorf("submit to replica %d: %w", r.id, err)
	}
	return nil
}

// ConfigUpdate changes the run-time settings; nil fields stay as they are.
type ConfigUpdate struct {
	MaxNumSeqs *int `json:"max_num_seqs,omitempty"`
	Replicas   *int `json:"replicas,omitempty"`
	// Fault replaces the fault of every replica without one of its own,
	// replicas added later included ({} heals them).
	Fault *Fault `json:"fault,omitempty"`
	// ReplicaFaults sets the fault of single replicas by ID, which then
	// ignore Fault; a null fault gives the replica back to Fault.
	ReplicaFaults map[int]*Fault `json:"replica_faults,omitempty"`
	// RefuseParams replaces Config.RefuseParams ([] refuses none).
	RefuseParams *[]string `json:"refuse_params,omitempty"`
}

// validate reports every bad value of the update.
func (u ConfigUpdate) validate() error {
	if u.MaxNumSeqs == nil && u.Replicas == nil && u.Fault == nil && len(u.ReplicaFaults) == 0 && u.RefuseParams == nil {
		return fmt.Errorf("%w: set max_num_seqs, replicas, fault, replica_faults and/or refuse_params", ErrInvalidUpdate)
	}
	var errs []error
	if u.MaxNumSeqs != nil && (*u.MaxNumSeqs < 1 || *u.MaxNumSeqs > MaxMaxNumSeqs) {
		errs = append(errs, fmt.Errorf("max_num_seqs must be in 1..%d, got %d", MaxMaxNumSeqs, *u.MaxNumSeqs))
	}
	if u.Replicas != nil && (*u.Replicas < 1 || *u.Replicas > MaxReplicas) {
		errs = append(errs, fmt.Errorf("replicas must be in 1..%d, got %d", MaxReplicas, *u.Replicas))
	}
	errs = append(errs, u.validateFaults()...)
	if u.RefuseParams != nil {
		if err := validateRefuseParams(*u.RefuseParams); err != nil {
			errs = append(errs, fmt.Errorf("refuse_params %w", err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidUpdate, errors.Join(errs...))
	}
	return nil
}

// RuntimeConfig is the current configuration as GET /admin/config shows it.
type RuntimeConfig struct {
	Model                  string  `json:"model"`
	Mode                   string  `json:"mode"`
	Replicas               int     `json:"replicas"`
	DrainingReplicas       int     `json:"draining_replicas"`
	MaxNumSeqs             int     `json:"max_num_seqs"`
	KVCacheBlocks          int     `json:"kv_cache_blocks"`
	BlockSize              int     `json:"block_size"`
	MaxContextTokens       int     `json:"max_context_tokens"`
	PrefillPerTokenSeconds float64 `json:"prefill_per_token_seconds"`
	DecodeBaseSeconds      float64 `json:"decode_base_seconds"`
	DecodePerSeqSeconds    float64 `json:"decode_per_seq_seconds"`
	TimeScale              float64 `json:"time_scale"`
	Seed                   int64   `json:"seed"`
	DefaultMaxTokens       int     `json:"default_max_tokens"`
	AnswerMinTokens        int     `json:"answer_min_tokens"`
	AnswerMaxTokens        int     `json:"answer_max_tokens"`
	// Fault is every replica's fault but those in ReplicaFaults.
	Fault         Fault         `json:"fault"`
	ReplicaFaults map[int]Fault `json:"replica_faults,omitempty"`
	// RefuseParams is what requests may not set; [] when they may set all.
	RefuseParams []string `json:"refuse_params"`
}

// ErrInvalidUpdate marks a ConfigUpdate that was refused; nothing changed.
var ErrInvalidUpdate = errors.New("invalid config update")

// Reconfigure applies an update at run time. Lowering MaxNumSeqs never
// stops a running sequence: replicas just admit nobody until their batch
// is below the new limit. Removing replicas drains them. Faults apply from
// the next step of each replica, to the sequences it already holds too.
func (s *Server) Reconfigure(u ConfigUpdate) (RuntimeConfig, error) {
	if err := u.validate(); err != nil {
		return RuntimeConfig{}, err
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return RuntimeConfig{}, errServerClosed
	}
	// Faults go first: an update that names a replica that does not exist
	// must change nothing.
	if err := s.applyFaultsLocked(u, s.replicaIDsLocked()); err != nil {
		s.mu.Unlock()
		return RuntimeConfig{}, err
	}
	if u.MaxNumSeqs != nil {
		s.maxNumSeqs.Store(int64(*u.MaxNumSeqs))
		// A raised limit lets queued requests in at the next step; idle
		// schedulers have nothing queued, but waking them is harmless.
		for _, r := range s.active {
			r.poke()
		}
		for _, r := range s.draining {
			r.poke()
		}
	}
	if u.Replicas != nil {
		s.scaleLocked(*u.Replicas)
	}
	if u.RefuseParams != nil {
		refused := slices.Clone(*u.RefuseParams)
		s.refused.Store(&refused)
	}
	s.mu.Unlock()

	rc := s.RuntimeConfig()
	s.log.Info("reconfigured llm simulator", "max_num_seqs", rc.MaxNumSeqs, "replicas", rc.Replicas,
		"draining_replicas", rc.DrainingReplicas, "fault", rc.Fault, "replica_faults", rc.ReplicaFaults,
		"refuse_params", rc.RefuseParams)
	return rc, nil
}

// replicaIDsLocked is the set of replicas that exist, draining ones
// included. s.mu must be held.
func (s *Server) replicaIDsLocked() map[int]bool {
	ids := map[int]bool{}
	for _, r := range append(slices.Clone(s.active), s.draining...) {
		ids[r.id] = true
	}
	return ids
}

// RuntimeConfig returns the current configuration.
func (s *Server) RuntimeConfig() RuntimeConfig {
	s.mu.Lock()
	replicas, draining := len(s.active), len(s.draining)
	s.mu.Unlock()
	c := s.cfg
	fs := s.faults.Load()
	return RuntimeConfig{
		Fault:                  fs.server,
		ReplicaFaults:          maps.Clone(fs.replicas),
		RefuseParams:           append([]string{}, *s.refused.Load()...),
		Model:                  c.Model,
		Mode:                   c.Mode,
		Replicas:               replicas,
		DrainingReplicas:       draining,
		MaxNumSeqs:             s.limit(),
		KVCacheBlocks:          c.KVCacheBlocks,
		BlockSize:              c.BlockSize,
		MaxContextTokens:       c.contextTokens(),
		PrefillPerTokenSeconds: c.PrefillPerToken.Seconds(),
		DecodeBaseSeconds:      c.DecodeBase.Seconds(),
		DecodePerSeqSeconds:    c.DecodePerSeq.Seconds(),
		TimeScale:              c.TimeScale,
		Seed:                   c.Seed,
		DefaultMaxTokens:       c.DefaultMaxTokens,
		AnswerMinTokens:        c.AnswerMinTokens,
		AnswerMaxTokens:        c.AnswerMaxTokens,
	}
}

// Stats is a snapshot of the whole simulator. Totals include draining
// replicas, which still hold requests and KV blocks.
type Stats struct {
	// Running and Waiting count sequences: a request with n choices is n.
	Running     int
	Waiting     int
	UsedBlocks  int
	TotalBlocks int
	// CacheUsage is UsedBlocks/TotalBlocks, 0..1.
	CacheUsage float64
	// Preemptions counts every preemption since New, on any replica.
	Preemptions    int64
	MaxNumSeqs     int
	ActiveReplicas int
	Replicas       []ReplicaStats
}

// Stats returns a snapshot of every replica, active ones first.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	all := append(slices.Clone(s.active), s.draining...)
	active := len(s.active)
	s.mu.Unlock()
	st := Stats{MaxNumSeqs: s.limit(), ActiveReplicas: active, Preemptions: s.metrics.preemptions()}
	for _, r := range all {
		rs := r.stats()
		st.Replicas = append(st.Replicas, rs)
		st.Running += rs.Running
		st.Waiting += rs.Waiting
		st.UsedBlocks += rs.UsedBlocks
		st.TotalBlocks += rs.TotalBlocks
	}
	if st.TotalBlocks > 0 {
		st.CacheUsage = float64(st.UsedBlocks) / float64(st.TotalBlocks)
	}
	return st
}
