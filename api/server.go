// Package api is Sluice's HTTP front door (Echo): it authenticates and
// validates requests, starts one Temporal workflow per chat request, and
// streams the request's events back as Server-Sent Events, in Sluice's own
// format (/v1/chat) or OpenAI's (/v1/chat/completions). Bad input is
// refused here, before anything is started.
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/idempotency"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/iphash"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/semaphore"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/pkg/waitroom"
)

// Server is the HTTP API.
type Server struct {
	cfg      config.Config
	echo     *echo.Echo
	temporal client.Client
	redis    redis.UniversalClient
	events   *events.Log
	hub      *events.Hub
	gate     *admission.Gate
	prompts  *prompt.Builder
	limiter  *limiter.Limiter
	policy   *policy.Store
	kbs      map[string]bool // the configured kbs, by key (kbref.Ref.Key)
	kbStore  *kbstore.Store
	seenKBs  sync.Map // kb keys known to exist (see kbKnown)
	ingester *ingest.Ingester
	// embeddings serves POST /v1/embeddings; nil refuses it.
	embeddings Embeddings
	// ingestSlots bounds concurrent ingestion across instances.
	ingestSlots *semaphore.Semaphore
	// keys are the configured keys by their hash; keyCache verifies
	// managed ones (nil: none).
	keys     map[string]keys.Spec
	keyCache *keys.Cache
	// bans refuses floods (nil: off).
	bans *ban.Guard
	// addresses names client addresses in rate-limit keys and logs by
	// their keyed hash (privacy.ip_hash_key).
	addresses *iphash.Hasher
	sessions  *session.Store
	metrics   *metrics.Metrics
	// answerKBs are the kbs whose answers the L3 tier keeps, by key.
	answerKBs map[string]bool
	logger    *slog.Logger
	// draining is set when the process shuts down: streams then end
	// without detaching, so their requests carry on.
	draining atomic.Bool
	// unready makes GET /readyz answer 503 from the moment the process is
	// told to stop, so that load balancers stop sending it requests.
	unready atomic.Bool
	// room holds the requests waiting at the door, and a slot per workflow
	// start in flight.
	room *waitroom.Room
	// stats caches each pool's admission stats for the door's waiters.
	stats statsCache
	// conns caps the connections Run accepts; set by Run.
	conns *connLimiter
	// live ends the streams of requests whose workflow is gone.
	live *liveness
	// refusals samples the log lines of requests refused before any
	// workflow, per tenant and reason.
	refusals *logSampler
	// idem maps Idempotency-Keys to the requests they started.
	idem *idempotency.Store
	// builtAt is when the server was built.
	builtAt time.Time
	// handler is echo, in a server span per request when tracing is on.
	handler http.Handler
}

// Options are the Server's dependencies.
type Options struct {
	Config   config.Config
	Temporal client.Client
	Redis    redis.UniversalClient
	Events   *events.Log
	Hub      *events.Hub
	Gate     *admission.Gate
	Prompts  *prompt.Builder
	// Limiter enforces limits.* at the door; nil disables rate limits.
	Limiter *limiter.Limiter
	// Policy is the live traffic policy; nil uses the configuration's.
	Policy *policy.Store
	// KBs and Ingester serve /v1/kb; without KBs, chat requests may name
	// only the configured kbs.
	KBs      *kbstore.Store
	Ingester *ingest.Ingester
	// Embeddings, if set, serves POST /v1/embeddings (the worker's
	// embedding cache, embed.Cache).
	Embeddings Embeddings
	// Sessions serves /v1/sessions and records requests refused at the
	// door in their session; nil disables both.
	Sessions *session.Store
	// Metrics, if set, is served at GET /metrics and counts refusals at
	// the door and rate-limit decisions.
	Metrics *metrics.Metrics
	// Keys verifies managed API keys and serves /v1/admin/keys; nil
	// accepts only the configured keys. Run runs its invalidation.
	Keys *keys.Cache
	// Bans refuses IPs and keys that flood; nil disables bans.
	Bans *ban.Guard
	// Tracer, if set, traces each request from its HTTP span on
	// (pkg/tracing); nil traces nothing.
	Tracer trace.TracerProvider
	Logger *slog.Logger
}

// New builds the server and its routes.
func New(opts Options) (*Server, error) {
	if opts.Temporal == nil || opts.Redis == nil || opts.Events == nil || opts.Hub == nil || opts.Gate == nil || opts.Prompts == nil {
		return nil, errors.New("api: Temporal, Redis, Events, Hub, Gate and Prompts are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{
		cfg: opts.Config, temporal: opts.Temporal, redis: opts.Redis, events: opts.Events, hub: opts.Hub,
		gate: opts.Gate, prompts: opts.Prompts, limiter: opts.Limiter, policy: opts.Policy, logger: opts.Logger,
		kbs: map[string]bool{}, keys: map[string]keys.Spec{}, sessions: opts.Sessions, answerKBs: map[string]bool{}, metrics: opts.Metrics,
	}
	room, err := waitroom.New(waitroom.Options{
		Slots: opts.Config.API.MaxStartsInFlight, Capacity: opts.Config.API.WaitingRoom,
		Ready: s.poolReady, Logger: s.logger.With("component", "waiting-room"),
	})
	if err != nil {
		return nil, err
	}
	s.room = room
	s.builtAt = time.Now()
	s.idem = idempotency.New(opts.Redis, opts.Config.Redis.KeyPrefix, opts.Config.API.IdempotencyTTL)
	s.refusals = newLogSampler()
	s.live = newLiveness(opts.Temporal, opts.Config.Temporal.Namespace, opts.Events, opts.Gate, s.logger.With("component", "liveness"))
	for _, kb := range opts.Config.Retrieval.KnowledgeBases {
		s.kbs[kbref.Ref{Tenant: kb.Tenant, Name: kb.Name}.Key()] = true
	}
	for _, kb := range opts.Config.AnswerCache.KBs {
		s.answerKBs[kb] = true
	}
	s.kbStore, s.ingester, s.embeddings = opts.KBs, opts.Ingester, opts.Embeddings
	if s.ingester != nil {
		var err error
		s.ingestSlots, err = semaphore.New(opts.Redis, semaphore.Options{
			Key: opts.Config.Redis.KeyPrefix + "ingest:permits", Limit: opts.Config.Ingest.MaxConcurrent, Lease: opts.Config.Ingest.Lease})
		if err != nil {
			return nil, err
		}
	}
	for i, k := range opts.Config.Auth.APIKeys {
		scopes, err := keys.GrantedScopes(k.Scopes)
		if err != nil {
			return nil, fmt.Errorf("auth.api_keys[%d].scopes: %w", i, err)
		}
		s.keys[k.Hash()] = keys.Spec{Tenant: k.Tenant, User: k.User, Tier: k.Tier, Scopes: scopes}
	}
	s.keyCache, s.bans = opts.Keys, opts.Bans
	s.addresses = iphash.New([]byte(opts.Config.Privacy.IPHashKey))
	if s.policy == nil {
		s.policy = policy.NewStore(opts.Redis, opts.Config, opts.Gate, s.logger)
	}
	s.echo = s.routes(opts.Metrics)
	if opts.Tracer != nil {
		s.echo.Use(s.nameSpan)
	}
	s.handler = traced(s.echo, opts.Tracer)
	return s, nil
}

// routes is the server's Echo, with its middleware and every route.
func (s *Server) routes(m *metrics.Metrics) *echo.Echo {
	e := echo.New()
	e.IPExtractor = echo.ExtractIPDirect()
	if s.cfg.API.TrustForwardedFor {
		e.IPExtractor = echo.ExtractIPFromXFFHeader()
	}
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = s.handleError
	e.Use(s.recoverJSON)
	e.POST("/v1/chat", s.postChat)
	e.POST(chatCompletionsPath, s.postChatCompletions)
	e.GET(modelsPath, s.listModels)
	e.POST(embeddingsPath, s.postEmbeddings)
	e.GET("/v1/requests/:id", s.getRequest)
	e.GET("/v1/requests/:id/events", s.getEvents)
	e.DELETE("/v1/requests/:id", s.deleteRequest)
	e.GET("/v1/kb", s.listKBs)
	e.GET("/v1/kb/:kb", s.getKB)
	e.POST("/v1/kb/:kb/documents", s.postDocuments)
	e.DELETE("/v1/kb/:kb/documents/:id", s.deleteDocument)
	e.GET("/v1/sessions/:id", s.getSession)
	e.DELETE("/v1/sessions/:id", s.deleteSession)
	admin := e.Group("/v1/admin", s.requireAdmin)
	admin.GET("/limits", s.getLimits)
	admin.PUT("/limits", s.putLimits)
	admin.GET("/queue", s.getQueue)
	admin.POST("/keys", s.postKey)
	admin.GET("/keys", s.listKeys)
	admin.DELETE("/keys/:id", s.revokeKey)
	admin.GET("/bans", s.listBans)
	admin.DELETE("/bans/:kind/:value", s.liftBan)
	s.routeCodec(e)
	if m != nil {
		e.GET("/metrics", echo.WrapHandler(m.Handler()))
	}
	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	return e
}

// Handler returns the HTTP handler, for tests and embedding.
func (s *Server) Handler() http.Handler { return s.handler }

// Run serves on cfg.API.Addr until ctx ends, then shuts down gracefully:
// it stops accepting, calls endStreams (which should close the event hub,
// ending open SSE streams) and waits up to api.shutdown_timeout for
// handlers. ready, if not nil, receives the bound address once listening.
func (s *Server) Run(ctx context.Context, ready func(addr string), endStreams func()) error {
	ln, err := net.Listen("tcp", s.cfg.API.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.API.Addr, err)
	}
	conns := limitConns(ln, s.cfg.API.MaxConns, s.cfg.API.MaxConnsPerIP, s.logger)
	conns.addresses = s.addresses
	s.conns = conns
	srv := s.httpServer()
	if ready != nil {
		ready(ln.Addr().String())
	}
	roomCtx, stopRoom := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRoom()
	go s.room.Run(roomCtx)
	go s.live.run(roomCtx)
	if s.keyCache != nil {
		go s.keyCache.Run(roomCtx)
	}
	errCh := make(chan error, 1)
	go func() { errCh <- srv.Serve(conns) }()
	select {
	case err := <-errCh:
		return fmt.Errorf("serve http: %w", err)
	case <-ctx.Done():
	}
	s.unready.Store(true)
	s.drainDelay()
	s.draining.Store(true)
	if endStreams != nil {
		endStreams()
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.API.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Open SSE streams did not end in time; close them. Their requests
		// continue in Temporal and can be resumed from another instance.
		_ = srv.Close()
	}
	return nil
}

// readHeaderTimeout bounds the wait for a request's headers.
const readHeaderTimeout = 10 * time.Second

// httpServer is the server of Run, with every wait on a client bounded:
// headers, body, idle keep-alive connections, and (in stream) each write
// of an event stream. There is no WriteTimeout: it would cut every stream
// off at a fixed age.
func (s *Server) httpServer() *http.Server {
	return &http.Server{
		Handler:           bodyDeadline(s.handler, s.cfg.API.BodyReadTimeout),
		ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout:       s.cfg.API.IdleTimeout,
	}
}

// bodyDeadline gives a request's body timeout to arrive once its headers
// are in, whether or not its handler reads it (the server reads what is
// left afterwards). The server clears the deadline itself when the body
// is done, before it watches the connection for the client leaving; a
// request without a body is left alone, as that watch has already begun.
// http.Server.ReadTimeout would count the headers' time too.
func bodyDeadline(next http.Handler, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(timeout))
		}
		next.ServeHTTP(w, r)
	})
}

// drainDelay keeps serving for api.drain_delay after the stop signal, with
// /readyz failing, so that a load balancer that probes the pod itself
// takes it out before the listener closes; requests arriving meanwhile are
// served as usual.
func (s *Server) drainDelay() {
	d := s.cfg.API.DrainDelay
	if d <= 0 {
		return
	}
	s.logger.Info("draining: /readyz answers 503 before the listener closes", "drain_delay", d)
	time.Sleep(d)
}

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(c echo.Context) error {
	if s.unready.Load() {
		return c.JSON(http.StatusServiceUnavailable, map[string]any{"ready": false, "draining": true})
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	checks := map[string]string{"redis": "ok", "temporal": "ok"}
	ready := true
	// Whoever can reach /readyz hears what is down, not where it is: the
	// errors name internal addresses, and go to the log.
	if err := s.redis.Ping(ctx).Err(); err != nil {
		s.logger.Warn("readiness: redis", "err", err)
		checks["redis"] = "unavailable"
		ready = false
	}
	if _, err := s.temporal.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
		s.logger.Warn("readiness: temporal", "err", err)
		checks["temporal"] = "unavailable"
		ready = false
	}
	status := http.StatusOK
	if !ready {
		status = http.StatusServiceUnavailable
	}
	return c.JSON(status, map[string]any{"ready": ready, "checks": checks})
}
