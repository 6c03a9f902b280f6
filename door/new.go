// Package door is admission at the edge: what happens to a chat request
// between its decoded body and its running workflow. It checks the
// caller's bans and rate limits, resolves Idempotency-Keys, routes the
// request to a pool, holds it in the waiting room while the pool's queue
// is long, starts its workflow and subscribes to its events; a request
// that never starts is ended here, with its charge given back. It also
// follows started requests for their streams (queue positions, and the
// liveness sweep that ends the streams of workflows that vanished).
//
// The HTTP layer (package api) decodes and authenticates, calls Admit,
// and renders what it returns; nothing here knows about HTTP beyond the
// status a refusal carries (refusal.Error) and the headers a client hears.
package door

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/budget"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
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
	// live ends the streams of requests whose workflow is gone.
	live *liveness
	// refusals samples the log lines of requests refused before any
	// workflow, per tenant and reason.
	refusals *logsample.Sampler
	// idem maps Idempotency-Keys to the requests they started.
	idem *idempotency.Store
	// draining is set when the process shuts down: requests waiting at
	// the door end as "restarting", and streams end without detaching.
	draining atomic.Bool
	logger   *slog.Logger
}

// Options are the Door's dependencies.
type Options struct {
	Config   config.Config
	Temporal client.Client
	Redis    redis.UniversalClient
	Events   *events.Log
	Hub      *events.Hub
	Gate     *admission.Gate
	Prompts  *prompt.Builder
	// Policy is the live traffic policy.
	Policy *policy.Store
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
	if opts.Temporal == nil || opts.Redis == nil || opts.Events == nil || opts.Hub == nil || opts.Gate == nil ||
		opts.Prompts == nil || opts.Policy == nil {
		return nil, errors.New("door: Temporal, Redis, Events, Hub, Gate, Prompts and Policy are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	d := &Door{
		cfg: opts.Config, temporal: opts.Temporal, events: opts.Events, hub: opts.Hub, gate: opts.Gate,
		prompts: opts.Prompts, limiter: opts.Limiter, budgets: opts.Budgets, policy: opts.Policy, bans: opts.Bans, sessions: opts.Sessions,
		metrics: opts.Metrics, addresses: opts.Addresses, kbStore: opts.KBs,
		answerKBs: map[string]bool{}, refusals: logsample.New(), logger: opts.Logger,
		kbs: newKBs(opts.Config.Retrieval.KnowledgeBases, opts.KBs),
	}
	for _, kb := range opts.Config.AnswerCache.KBs {
		d.answerKBs[kb] = true
	}
	room, err := waitroom.New(waitroom.Options{
		Slots: opts.Config.API.MaxStartsInFlight, Capacity: opts.Config.API.WaitingRoom,
		Ready: d.poolReady, Logger: d.logger.With("component", "waiting-room"),
	})
	if err != nil {
		return nil, err
	}
	d.room = room
	d.idem = idempotency.New(opts.Redis, opts.Config.Redis.KeyPrefix, opts.Config.API.IdempotencyTTL)
	d.live = newLiveness(opts.Temporal, opts.Config.Temporal.Namespace, opts.Events, opts.Gate, d.logger.With("component", "liveness"))
	return d, nil
}

// Run runs the waiting room and the liveness sweep until ctx ends.
func (d *Door) Run(ctx context.Context) {
	go d.room.Run(ctx)
	d.live.run(ctx)
}

// Drain marks the process as shutting down: requests still waiting at the
// door end telling their clients to retry, and streams that end do not
// detach their requests (the clients resume against another instance).
func (d *Door) Drain() { d.draining.Store(true) }

// Draining reports whether Drain was called.
func (d *Door) Draining() bool { return d.draining.Load() }

// Room is the waiting room's state, for the admin queue view.
func (d *Door) Room() waitroom.Stats { return d.room.Stats() }

// KBs resolves and checks knowledge-base names for callers.
func (d *Door) KBs() *KBs { return d.kbs }
