package config

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/keys"
)

// API configures the Echo HTTP front door.
type API struct {
	// Addr is the listen address of the HTTP API.
	Addr string `yaml:"addr"`
	// MaxBodyBytes bounds a request body; larger bodies get 413.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxQueryChars bounds the query text; longer queries get 413.
	MaxQueryChars int `yaml:"max_query_chars"`
	// DefaultMaxTokens is the output budget of a request that names none.
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// MaxTokensLimit is the largest max_tokens a request may ask for.
	MaxTokensLimit int `yaml:"max_tokens_limit"`
	// EmbeddedWorker runs a Temporal worker inside the API process so that
	// eager workflow start can hand the first workflow task to it directly.
	EmbeddedWorker bool `yaml:"embedded_worker"`
	// StreamIdleTimeout: an SSE stream that has seen no event for this long
	// checks whether its request's workflow is gone, and ends with an
	// error if it is. It backs up the API's rounds every 2 s, which check
	// only requests seen started; it is not a request deadline.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// ShutdownTimeout bounds graceful shutdown of open streams.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// DrainDelay is how long the API keeps serving after SIGTERM with
	// GET /readyz answering 503, before it stops accepting: a load
	// balancer that probes pods itself (not through a Kubernetes Service)
	// needs that long to take the pod out. 0: stop accepting at once.
	DrainDelay time.Duration `yaml:"drain_delay"`
	// DisconnectGrace is how long a request whose client went away waits
	// for it to reconnect (GET /v1/requests/:id/events with Last-Event-ID)
	// before it cancels itself; 0 cancels at once.
	DisconnectGrace time.Duration `yaml:"disconnect_grace"`
	// QueuePollInterval is how often an SSE stream of a queued request
	// re-reads its position to send queue events.
	QueuePollInterval time.Duration `yaml:"queue_poll_interval"`
	// MaxStartsInFlight bounds the workflow starts one API process has
	// outstanding, so that a flood does not pile onto a Temporal server
	// that starts only so many workflows a second; beyond it requests wait
	// in the door's waiting room.
	MaxStartsInFlight int `yaml:"max_starts_in_flight"`
	// WaitingRoom bounds the requests one API process keeps waiting at the
	// door for a start slot (or for their pool's queue to shorten), in
	// weighted fair order, with queue events; beyond it, 503 busy with
	// Retry-After. 0: no waiting room, 503 busy whenever no slot is free.
	WaitingRoom int `yaml:"waiting_room"`
	// QueuePerPermit: a request starts its workflow only while its pool's
	// admission queue holds fewer than this many requests per permit of
	// the pool; the rest wait at the door, where waiting costs Temporal
	// nothing. 1 keeps every queued request within a permit turnover of
	// its grant. 0: start as soon as a start slot is free.
	QueuePerPermit float64 `yaml:"queue_per_permit"`
	// TrustedProxies are the networks (CIDR) of the proxies in front
	// whose X-Forwarded-For is believed: the client is the address left
	// of the last trusted hop, read right to left. Name the proxies' own
	// addresses (an ingress controller's pods, a load balancer's subnet),
	// never a whole pod network: whoever connects from a trusted network
	// names its client as it likes. A connection from a trusted proxy is
	// held to ProxyConnsShare instead of max_conns_per_ip (it carries many
	// clients), and the clients it names to max_conns_per_ip requests at
	// once. Empty: the client is the connection's address, which nobody
	// can forge.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// ProxyConnsShare is the share of max_conns that the connections of
	// one trusted proxy (one address) may hold, so that one proxy, or a
	// peer in a trusted network, cannot take every connection of the
	// process: it must be below 1.
	ProxyConnsShare float64 `yaml:"proxy_conns_share"`
	// BodyReadTimeout bounds the wait for a request's body once its
	// headers are in, so that a client that trickles it cannot hold a
	// connection: a body not in by then is answered 408 and its
	// connection closed.
	BodyReadTimeout time.Duration `yaml:"body_read_timeout"`
	// IdleTimeout closes a keep-alive connection that has carried no
	// request for this long.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// StreamWriteTimeout bounds each write of an event stream: a client
	// that stops reading until the socket's buffers are full is dropped
	// this long after, and its request detached, rather than pin its
	// handler.
	StreamWriteTimeout time.Duration `yaml:"stream_write_timeout"`
	// MaxConnsPerIP bounds the open connections from one client address
	// (an IPv6 client by its /64); beyond it a new connection is answered
	// 429 too_many_connections and closed. A proxy in trusted_proxies is
	// held to proxy_conns_share instead, and each client it names (by
	// X-Forwarded-For) to this many requests at once, refused beyond it
	// with the same 429.
	MaxConnsPerIP int `yaml:"max_conns_per_ip"`
	// MaxConns bounds the open connections of one API process; beyond it
	// a new connection is answered 503 connections_full and closed.
	MaxConns int `yaml:"max_conns"`
	// IdempotencyTTL is how long an Idempotency-Key names the request it
	// started: a retry within it attaches to that request. At most
	// events.ttl, so that the request's events are still there to attach
	// to.
	IdempotencyTTL time.Duration `yaml:"idempotency_ttl"`
}

// TrustedProxyPrefixes are TrustedProxies parsed; the configuration is
// validated, so they parse.
func (a API) TrustedProxyPrefixes() []netip.Prefix { return prefixes(a.TrustedProxies) }

// MaxConnsPerProxy is how many connections one trusted proxy may hold:
// ProxyConnsShare of MaxConns, at least one.
func (a API) MaxConnsPerProxy() int { return max(1, int(a.ProxyConnsShare*float64(a.MaxConns))) }

// Auth says who may call Sluice. Managed keys (created through
// /v1/admin/keys, kept hashed in Redis) are the usual credential; the keys
// listed here bootstrap a deployment and need not be written in plain
// text (key_sha256).
type Auth struct {
	// AllowAnonymous lets requests without an API key through as tenant
	// "anonymous" (dev stack only).
	AllowAnonymous bool     `yaml:"allow_anonymous"`
	APIKeys        []APIKey `yaml:"api_keys"`
	// AdminKey guards /v1/admin/*, as does any key with the admin scope;
	// AdminKeySHA256 is the same given as the hex SHA-256 of the key, so
	// that the file need not hold it. With neither set and no managed
	// keys, the admin routes do not exist.
	AdminKey       string `yaml:"admin_key"`
	AdminKeySHA256 string `yaml:"admin_key_sha256"`
	// KeyCacheTTL bounds how long an API process trusts a managed key it
	// read from Redis. Revocations reach every process at once over Redis
	// pub/sub; this is the backstop should a message be lost.
	KeyCacheTTL time.Duration `yaml:"key_cache_ttl"`
}

// APIKey is one configured credential: exactly one of Key (plain text,
// for the dev stack) and KeySHA256 (the hex SHA-256 of the key).
type APIKey struct {
	Key       string `yaml:"key"`
	KeySHA256 string `yaml:"key_sha256"`
	Tenant    string `yaml:"tenant"`
	User      string `yaml:"user"`
	Tier      string `yaml:"tier"`
	// Scopes the key grants (chat, ingest, admin); omitted, only chat:
	// a key may change knowledge bases or reach the admin API only when
	// its entry says so.
	Scopes []string `yaml:"scopes"`
}

// Hash is the hex SHA-256 the key is known by.
func (k APIKey) Hash() string {
	if k.KeySHA256 != "" {
		return strings.ToLower(k.KeySHA256)
	}
	return keys.Hash(k.Key)
}

func defaultAPI() API {
	return API{
		Addr:               "127.0.0.1:8080",
		MaxBodyBytes:       64 << 10,
		MaxQueryChars:      4000,
		DefaultMaxTokens:   128,
		MaxTokensLimit:     2048,
		EmbeddedWorker:     true,
		StreamIdleTimeout:  2 * time.Minute,
		ShutdownTimeout:    10 * time.Second,
		DisconnectGrace:    5 * time.Second,
		QueuePollInterval:  500 * time.Millisecond,
		MaxStartsInFlight:  64,
		WaitingRoom:        10000,
		QueuePerPermit:     1,
		BodyReadTimeout:    30 * time.Second,
		IdleTimeout:        2 * time.Minute,
		StreamWriteTimeout: 10 * time.Second,
		MaxConnsPerIP:      256,
		MaxConns:           10000,
		TrustedProxies:     []string{},
		ProxyConnsShare:    0.5,
		IdempotencyTTL:     time.Hour,
	}
}

func defaultAuth() Auth {
	return Auth{AllowAnonymous: true, KeyCacheTTL: 10 * time.Second}
}

func (a API) validate(v *validator, eventsTTL time.Duration) {
	v.nonEmpty("api.addr", a.Addr)
	v.positive("api.max_body_bytes", a.MaxBodyBytes)
	v.positive("api.max_query_chars", int64(a.MaxQueryChars))
	v.positive("api.default_max_tokens", int64(a.DefaultMaxTokens))
	v.positive("api.max_tokens_limit", int64(a.MaxTokensLimit))
	if a.DefaultMaxTokens > a.MaxTokensLimit {
		v.add("api.default_max_tokens", "must not exceed api.max_tokens_limit (%d)", a.MaxTokensLimit)
	}
	v.duration("api.stream_idle_timeout", a.StreamIdleTimeout)
	v.duration("api.shutdown_timeout", a.ShutdownTimeout)
	if a.DrainDelay < 0 {
		v.add("api.drain_delay", "must be >= 0, got %s", a.DrainDelay)
	}
	if a.DisconnectGrace < 0 {
		v.add("api.disconnect_grace", "must be >= 0, got %s", a.DisconnectGrace)
	}
	v.duration("api.queue_poll_interval", a.QueuePollInterval)
	v.positive("api.max_starts_in_flight", int64(a.MaxStartsInFlight))
	if a.WaitingRoom < 0 {
		v.add("api.waiting_room", "must be >= 0, got %d", a.WaitingRoom)
	}
	if !(a.QueuePerPermit >= 0) {
		v.add("api.queue_per_permit", "must be >= 0, got %v", a.QueuePerPermit)
	}
	v.duration("api.body_read_timeout", a.BodyReadTimeout)
	v.duration("api.idle_timeout", a.IdleTimeout)
	v.duration("api.stream_write_timeout", a.StreamWriteTimeout)
	v.positive("api.max_conns", int64(a.MaxConns))
	v.positive("api.max_conns_per_ip", int64(a.MaxConnsPerIP))
	if a.MaxConnsPerIP > a.MaxConns {
		v.add("api.max_conns_per_ip", "must not exceed api.max_conns (%d), got %d", a.MaxConns, a.MaxConnsPerIP)
	}
	v.networks("api.trusted_proxies", a.TrustedProxies)
	if !(a.ProxyConnsShare > 0 && a.ProxyConnsShare < 1) {
		v.add("api.proxy_conns_share", "must be above 0 and below 1 (one proxy must leave the process room for the others), got %v", a.ProxyConnsShare)
	}
	v.duration("api.idempotency_ttl", a.IdempotencyTTL)
	if eventsTTL > 0 && a.IdempotencyTTL > eventsTTL {
		v.add("api.idempotency_ttl", "must not exceed events.ttl (%s), got %s", eventsTTL, a.IdempotencyTTL)
	}
}

var sha256Hex = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// validate checks the keys themselves; the tiers they name are checked
// with the limits that define them. A deployment without anonymous access
// may list no credential at all: managed keys in Redis are enough.
func (a Auth) validate(v *validator) {
	seen := map[string]bool{}
	for i, k := range a.APIKeys {
		field := fmt.Sprintf("auth.api_keys[%d]", i)
		switch {
		case (k.Key == "") == (k.KeySHA256 == ""):
			v.add(field, "set exactly one of key and key_sha256")
		case k.KeySHA256 != "" && !sha256Hex.MatchString(k.KeySHA256):
			v.add(field+".key_sha256", "must be 64 hex digits (sha256sum of the key)")
		default:
			v.uniqueName(seen, field, k.Hash(), "duplicate key")
		}
		if k.Tenant == "" {
			v.add(field+".tenant", "must not be empty")
		}
		if _, err := keys.ParseScopes(k.Scopes); err != nil {
			v.add(field+".scopes", "%v", err)
		}
	}
	if a.AdminKey != "" && a.AdminKeySHA256 != "" {
		v.add("auth.admin_key_sha256", "set at most one of admin_key and admin_key_sha256")
	}
	if a.AdminKeySHA256 != "" && !sha256Hex.MatchString(a.AdminKeySHA256) {
		v.add("auth.admin_key_sha256", "must be 64 hex digits (sha256sum of the key)")
	}
	v.duration("auth.key_cache_ttl", a.KeyCacheTTL)
}
