// Package door is admission at the edge: what happens to a chat request
// between its decoded body and its running workflow. It checks the
// caller's bans and rate limits, resolves Idempotency-Keys, routes the
// request to a pool, holds it in the waiting room while the pool's queue
// is long, starts its workflow and subscribes to its events; a request
// that never starts is ended here, with what it holds given back.
//
// It speaks no transport: it takes a Request and a Caller and answers
// with an Admission, or refuses with a *refusal.Error; what the client is
// told of its limits is a Standing. Package api maps these to HTTP
// (api/httpio); following a started request's events is package follow's.
package door

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"

	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/idempotency"
	"github.com/sluice-dev/sluice/pkg/iphash"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/limiter"
	"github.com/sluice-dev/sluice/pkg/logsample"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/session"
	"github.com/sluice-dev/sluice/pkg/waitroom"
)

// Door admits chat requests. One per API process.
type Door struct {
	cfg      config.Config
	temporal client.Client
	events   *events.Log
	hub      *events.Hub
	gate     *admission.Gate
	prompts  *prompt.Builder
	// limiter enforces limits.* (nil: no rate limits).
	limiter *limiter.Limiter
	// budgets counts the tiers' monthly budgets (nil: none).
	budgets *budget.Counter
	policy  *policy.Store
	// bans refuses floods (nil: off).
	bans     *ban.Guard
	sessions *session.Store
	metrics  *metrics.Metrics
	// addresses names client addresses in rate-limit keys and logs by
	// their keyed hash (privacy.ip_hash_key).
	addresses *iphash.Hasher
	kbs       *KBs
	kbStore   *kbstore.Store
	// answerKBs are the kbs whose answers the L3 tier keeps, by key.
	answerKBs map[string]bool
	// room holds the requests waiting at the door, and a slot per
	// workflow start in flight.
	room *waitroom.Room
	// stats caches each pool's admission stats for the door's waiters.
	stats statsCache
	// stops tells the door's waiters of their stop flags.
	stops *stopWatch
	// refusals samples the log lines of requests refused before any
	// workflow, per tenant and reason.
	refusals *logsample.Sampler
	// idem maps Idempotency-Keys to the requests they started (nil:
	// keys are ignored).
	idem *idempotency.Store
	// attacher follows a request an Idempotency-Key names.
	attacher Attacher
	// returner gives back what a request that never started holds.
	returner *holdings.Returner
	// draining is set when the process shuts down: requests waiting at
	// the door end as "restarting".
	draining atomic.Bool
	logger   *slog.Logger
}

// Attacher follows a request that already runs, for a client that sent
// the POST that started it again (follow.Follower.Attach): from its first
// event, or after the event id after. A request whose events are gone is
// follow.ErrStreamGone.
type Attacher interface {
	Attach(ctx context.Context, id, after string) (*events.Subscription, error)
}

// Options are the Door's dependencies, each built once by the process
// (package app).
type Options struct {
	Config   config.Config
	Temporal client.Client
	Events   *events.Log
	Hub      *events.Hub
	Gate     *admission.Gate
	Prompts  *prompt.Builder
	// Policy is the live traffic policy.
	Policy *policy.Store
	// Room is the waiting room, whose Ready must be the door's PoolReady
	// (NewRoom builds it so).
	Room *waitroom.Room
	// Idempotency resolves Idempotency-Keys; nil ignores them.
	Idempotency *idempotency.Store
	// Attacher follows the request an Idempotency-Key names.
	Attacher Attacher
	// Returner gives back what a request that never started holds; its
	// Limiter, Budgets and Keys must be this Door's.
	Returner *holdings.Returner
	// Limiter enforces limits.* at the door; nil disables rate limits.
	Limiter *limiter.Limiter
	// Budgets enforces the tiers' monthly budgets; nil disables them.
	Budgets *budget.Counter
	// Bans refuses IPs and keys that flood; nil disables bans.
	Bans *ban.Guard
	// KBs, if set, holds the tenants' own knowledge bases; without it,
	// chat requests may name only the configured kbs.
	KBs *kbstore.Store
	// Sessions records requests refused at the door in their session;
	// nil records nothing.
	Sessions *session.Store
	// Metrics counts refusals and rate-limit decisions; nil counts none.
	Metrics *metrics.Metrics
	// Addresses hashes client addresses (privacy.ip_hash_key).
	Addresses *iphash.Hasher
	Logger    *slog.Logger
}

// New builds the door.
func New(opts Options) (*Door, error) {
	if opts.Temporal == nil || opts.Events == nil || opts.Hub == nil || opts.Gate == nil ||
		opts.Prompts == nil || opts.Policy == nil || opts.Room == nil || opts.Attacher == nil || opts.Returner == nil {
		return nil, errors.New("door: Temporal, Events, Hub, Gate, Prompts, Policy, Room, Attacher and Returner are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	d := &Door{
		cfg: opts.Config, temporal: opts.Temporal, events: opts.Events, hub: opts.Hub, gate: opts.Gate,
		prompts: opts.Prompts, limiter: opts.Limiter, budgets: opts.Budgets, policy: opts.Policy, bans: opts.Bans, sessions: opts.Sessions,
		metrics: opts.Metrics, addresses: opts.Addresses, kbStore: opts.KBs, room: opts.Room, idem: opts.Idempotency,
		attacher: opts.Attacher, returner: opts.Returner, answerKBs: map[string]bool{}, refusals: logsample.New(), logger: opts.Logger,
		kbs:   newKBs(opts.Config.Retrieval.KnowledgeBases, opts.KBs),
		stops: newStopWatch(opts.Events, opts.Config.API.QueuePollInterval, opts.Config.Redis.RequestTimeout, opts.Logger),
	}
	for _, kb := range opts.Config.AnswerCache.KBs {
		d.answerKBs[kb] = true
	}
	return d, nil
}

// NewRoom is the door's waiting room under cfg: a request waits there
// while its pool's queue is long (PoolReady), with a slot per workflow
// start in flight. Its Run is the process's to start.
func NewRoom(cfg config.Config, gate *admission.Gate, live *policy.Store, logger *slog.Logger) (*waitroom.Room, error) {
	ready := poolReadiness{cfg: cfg, gate: gate, policy: live}
	return waitroom.New(waitroom.Options{
		Slots: cfg.API.MaxStartsInFlight, Capacity: cfg.API.WaitingRoom, Ready: ready.ready, Shifts: gate.Shifts, Logger: logger,
	})
}

// Drain marks the process as shutting down: requests still waiting at the
// door end telling their clients to retry.
func (d *Door) Drain() { d.draining.Store(true) }

// Room is the waiting room's state, for the admin queue view.
func (d *Door) Room() waitroom.Stats { return d.room.Stats() }

// KBs resolves and checks knowledge-base names for callers.
func (d *Door) KBs() *KBs { return d.kbs }
