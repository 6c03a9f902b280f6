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
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/api/apispec"
	"github.com/sluice-dev/sluice/api/openai"
	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/follow"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/codec"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/files"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/iphash"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/responses"
	"github.com/sluice-dev/sluice/pkg/semaphore"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/pkg/usage"
	"github.com/sluice-dev/sluice/pkg/version"
)

// Server is the HTTP API.
type Server struct {
	cfg      config.Config
	echo     *echo.Echo
	temporal client.Client
	redis    redis.UniversalClient
	events   *events.Log
	gate     *admission.Gate
	prompts  *prompt.Builder
	policy   *policy.Store
	// door admits chat requests; follow follows them for their clients.
	door   *door.Door
	follow *follow.Follower
	// kbStore and ingester serve /v1/kb (nil: no kb writes).
	kbStore  *kbstore.Store
	ingester *ingest.Ingester
	// embeddings serves OpenAI's POST /v1/embeddings; nil refuses it.
	embeddings openai.Embeddings
	// ingestSlots bounds concurrent ingestion across instances;
	// ingestHere, this process's (ingest.max_concurrent_per_process).
	ingestSlots *semaphore.Semaphore
	ingestHere  chan struct{}
	// keys are the configured keys by their hash; keyCache verifies
	// managed ones (nil: none).
	keys     map[string]keys.Spec
	keyCache *keys.Cache
	// codec is the payload keyring the codec endpoint serves (nil: off).
	codec *codec.Keyring
	// bans lists and lifts bans for the admin routes (nil: off); the
	// door checks them.
	bans *ban.Guard
	// addresses names client addresses in traces and logs by their keyed
	// hash (privacy.ip_hash_key).
	addresses *iphash.Hasher
	sessions  *session.Store
	// usage is the usage ledger /v1/usage reads (nil: off).
	usage usage.Store
	// responses keeps the Responses API's stored responses (nil: off).
	responses *responses.Store
	// files keeps uploaded files (nil: off).
	files *files.Store
	// budgets reads the caller's monthly budget for /v1/usage (nil: none).
	budgets *budget.Counter
	metrics *metrics.Metrics
	logger  *slog.Logger
	// unready makes GET /readyz answer 503 from the moment the process is
	// told to stop, so that load balancers stop sending it requests.
	unready atomic.Bool
	// proxies are the trusted proxies in front (api.trusted_proxies);
	// clientSlots holds the clients they name to api.max_conns_per_ip
	// requests at once.
	proxies     proxies
	clientSlots *clientSlots
	// conns caps the connections Run accepts; set by Run.
	conns *connLimiter
	// handler is echo, in a server span per request when tracing is on.
	handler http.Handler
	// spec serves the API's OpenAPI description (package apispec).
	spec http.Handler
}

// Options are the Server's dependencies, each built once by the process
// that serves (package app).
type Options struct {
	Config   config.Config
	Temporal client.Client
	Redis    redis.UniversalClient
	Events   *events.Log
	Gate     *admission.Gate
	Prompts  *prompt.Builder
	Policy   *policy.Store
	Door     *door.Door
	Follow   *follow.Follower
	// Addresses hashes client addresses (privacy.ip_hash_key).
	Addresses *iphash.Hasher
	// KBs and Ingester serve /v1/kb, taking one of IngestSlots (shared by
	// every instance) per batch.
	KBs         *kbstore.Store
	Ingester    *ingest.Ingester
	IngestSlots *semaphore.Semaphore
	// Embeddings, if set, serves POST /v1/embeddings (the worker's
	// embedding cache, embed.Cache).
	Embeddings openai.Embeddings
	// Sessions serves /v1/sessions; nil disables it.
	Sessions *session.Store
	// Usage serves /v1/usage and /v1/admin/usage; nil: they answer 404.
	Usage usage.Store
	// Responses keeps stored responses (/v1/responses); nil: none is
	// stored.
	Responses *responses.Store
	// Files keeps uploaded files (/v1/files); nil: files.store is off.
	Files *files.Store
	// Budgets, if set, adds the caller's monthly budget to /v1/usage; the
	// door enforces it (door.Options.Budgets).
	Budgets *budget.Counter
	// Metrics, if set, is served at GET /metrics (on api.addr unless
	// metrics.addr names a listener of its own, which the app runs).
	Metrics *metrics.Metrics
	// Keys verifies managed API keys and serves /v1/admin/keys; nil
	// accepts only the configured keys. Its invalidation (Cache.Run) is
	// the process's to run (app), as the waiting room's and the liveness
	// sweep's are.
	Keys *keys.Cache
	// Codec, if set, is the payload keyring (codec.enabled) that the
	// codec endpoint serves to the Temporal UI and CLI.
	Codec *codec.Keyring
	// Bans serves /v1/admin/bans; nil disables it.
	Bans *ban.Guard
	// Tracer, if set, traces each request from its HTTP span on
	// (pkg/tracing); nil traces nothing.
	Tracer trace.TracerProvider
	Logger *slog.Logger
}

// New builds the server and its routes.
func New(opts Options) (*Server, error) {
	if opts.Temporal == nil || opts.Redis == nil || opts.Events == nil || opts.Gate == nil || opts.Prompts == nil ||
		opts.Policy == nil || opts.Door == nil || opts.Follow == nil {
		return nil, errors.New("api: Temporal, Redis, Events, Gate, Prompts, Policy, Door and Follow are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{
		cfg: opts.Config, temporal: opts.Temporal, redis: opts.Redis, events: opts.Events, gate: opts.Gate,
		prompts: opts.Prompts, policy: opts.Policy, door: opts.Door, follow: opts.Follow, logger: opts.Logger, keys: map[string]keys.Spec{},
		sessions: opts.Sessions, usage: opts.Usage, responses: opts.Responses, files: opts.Files, budgets: opts.Budgets, metrics: opts.Metrics, kbStore: opts.KBs, ingester: opts.Ingester, embeddings: opts.Embeddings,
		ingestSlots: opts.IngestSlots, ingestHere: make(chan struct{}, opts.Config.Ingest.MaxConcurrentPerProcess), codec: opts.Codec,
		keyCache: opts.Keys, bans: opts.Bans, addresses: opts.Addresses, proxies: opts.Config.API.TrustedProxyPrefixes(),
		clientSlots: newClientSlots(opts.Config.API.MaxConnsPerIP),
	}
	if s.ingester != nil && s.ingestSlots == nil {
		return nil, errors.New("api: an Ingester needs IngestSlots")
	}
	for i, k := range opts.Config.Auth.APIKeys {
		scopes, err := keys.GrantedScopes(k.Scopes)
		if err != nil {
			return nil, fmt.Errorf("auth.api_keys[%d].scopes: %w", i, err)
		}
		s.keys[k.Hash()] = keys.Spec{Tenant: k.Tenant, User: k.User, Tier: k.Tier, Scopes: scopes}
	}
	spec, err := apispec.Handler(version.Version)
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	s.spec = spec
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
	e.IPExtractor = s.proxies.extractor()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = s.handleError
	e.Use(s.recoverJSON, checkQuery)
	e.Use(s.holdForwardedClient)
	e.POST("/v1/chat", s.postChat)
	openai.New(openai.Options{Config: s.cfg, Door: s.door, Follow: s.follow, Auth: callers{s}, Prompts: s.prompts, Embeddings: s.embeddings,
		Responses: s.responses, Files: s.files, Events: s.events, Logger: s.logger}).Register(e)
	e.GET("/v1/requests/:id", s.getRequest)
	e.GET("/v1/requests/:id/events", s.getEvents)
	e.DELETE("/v1/requests/:id", s.deleteRequest)
	e.GET("/v1/kb", s.listKBs)
	e.GET("/v1/kb/:kb", s.getKB)
	e.POST("/v1/kb/:kb/documents", s.postDocuments)
	// The id is the rest of the path: ids may hold "/" (sluice kb ingest
	// names a nested file's document by its path).
	e.DELETE("/v1/kb/:kb/documents/*", s.deleteDocument)
	e.GET("/v1/sessions/:id", s.getSession)
	e.DELETE("/v1/sessions/:id", s.deleteSession)
	e.GET("/v1/usage", s.getUsage)
	admin := e.Group("/v1/admin", s.requireAdmin)
	admin.GET("/limits", s.getLimits)
	admin.PUT("/limits", s.putLimits)
	admin.GET("/queue", s.getQueue)
	admin.POST("/keys", s.postKey)
	admin.GET("/keys", s.listKeys)
	admin.DELETE("/keys/:id", s.revokeKey)
	admin.GET("/bans", s.listBans)
	admin.DELETE("/bans/:kind/:value", s.liftBan)
	admin.GET("/usage", s.getAdminUsage)
	s.routeCodec(e)
	if m != nil && s.cfg.Metrics.Addr == "" {
		// With metrics.addr set, the app serves them there instead. Here
		// anyone may read them, so without the series that name tenants.
		e.GET("/metrics", echo.WrapHandler(m.PublicHandler()))
	}
	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET(apispec.Path, echo.WrapHandler(s.spec))
	return e
}

// Handler returns the HTTP handler, for tests and embedding.
func (s *Server) Handler() http.Handler { return s.handler }

// Run serves on cfg.API.Addr until ctx ends, then shuts down gracefully:
// it stops accepting, calls endStreams (which should close the event hub,
// ending open SSE streams) and waits up to api.shutdown_timeout for
// handlers. ready, if not nil, receives the bound address once listening.
// The door's and the key cache's loops are not its own: the process runs
// them (package app) until Run has returned.
func (s *Server) Run(ctx context.Context, ready func(addr string), endStreams func()) error {
	ln, err := net.Listen("tcp", s.cfg.API.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.cfg.API.Addr, err)
	}
	conns := limitConns(ln, connCaps{Total: s.cfg.API.MaxConns, PerIP: s.cfg.API.MaxConnsPerIP, PerProxy: s.cfg.API.MaxConnsPerProxy(),
		Proxies: s.proxies, Addresses: s.addresses, Metrics: s.metrics, Logger: s.logger})
	s.conns = conns
	srv := s.httpServer()
	if ready != nil {
		ready(ln.Addr().String())
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
	s.door.Drain()
	s.follow.Drain()
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

// maxHeaderBytes bounds a request's headers (Go's default is 1 MiB): twice
// what nginx passes by default (4 buffers of 8 KiB), so no client that
// passes a proxy is refused, while api.max_conns connections in their
// headers hold at most 64 KiB each.
const maxHeaderBytes = 64 << 10

// httpServer is the server of Run, with every wait on a client bounded:
// headers, body, idle keep-alive connections, and (in stream) each write
// of an event stream. There is no WriteTimeout: it would cut every stream
// off at a fixed age.
func (s *Server) httpServer() *http.Server {
	return &http.Server{
		Handler:           bodyDeadline(s.handler, s.cfg.API.BodyReadTimeout),
		ReadHeaderTimeout: readHeaderTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
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

// healthz says the process serves, and which build it is: a probe reads
// the status, a person rolling out a release the version and commit.
func (s *Server) healthz(c echo.Context) error {
	b := version.Get()
	return c.JSON(http.StatusOK, map[string]string{"status": "ok", "version": b.Version, "commit": b.Commit})
}

// readyz answers whether this process should get traffic: it serves and
// is not draining. A shared dependency that is down (Redis, Temporal) is
// shown, not acted on: every instance shares it, so failing readiness
// would pull them all out of the balancer at once, and clients would get
// the balancer's bare error instead of Sluice's own 503 with Retry-After.
func (s *Server) readyz(c echo.Context) error {
	if s.unready.Load() {
		return c.JSON(http.StatusServiceUnavailable, map[string]any{"ready": false, "draining": true})
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	deps := map[string]string{"redis": "ok", "temporal": "ok"}
	// Whoever can reach /readyz hears what is down, not where it is: the
	// errors name internal addresses, and go to the log.
	if err := s.redis.Ping(ctx).Err(); err != nil {
		s.logger.Warn("readiness: redis", "err", err)
		deps["redis"] = "unavailable"
	}
	if _, err := s.temporal.CheckHealth(ctx, &client.CheckHealthRequest{}); err != nil {
		s.logger.Warn("readiness: temporal", "err", err)
		deps["temporal"] = "unavailable"
	}
	return c.JSON(http.StatusOK, map[string]any{"ready": true, "dependencies": deps})
}
