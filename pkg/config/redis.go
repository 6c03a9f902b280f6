package config

import "time"

// Redis is the one Redis that holds permits, queues, caches and event streams.
type Redis struct {
	Addr     string `yaml:"addr"`
	Password string `yaml:"password"`
	DB       int    `yaml:"db"`
	// KeyPrefix namespaces every key Sluice writes, so that several
	// deployments (or tests) can share one Redis.
	KeyPrefix string `yaml:"key_prefix"`
	// Timeout bounds connecting and every command (a stalled or
	// unreachable Redis fails calls instead of hanging them; blocking
	// reads wait their block time on top).
	Timeout time.Duration `yaml:"timeout"`
	// RequestTimeout bounds each Redis call a client's request waits on at
	// the door (rate limits, queue depth, the accepted event): with Redis
	// stalled, the client gets 503 + Retry-After within about this long.
	RequestTimeout time.Duration `yaml:"request_timeout"`
}

// Events configures the per-request Redis Streams that carry SSE events.
type Events struct {
	// TTL is how long a request's event stream stays readable after its last
	// event, so that a client can reconnect with Last-Event-ID.
	TTL time.Duration `yaml:"ttl"`
	// MaxLen caps the entries of one stream (approximate trimming).
	MaxLen int64 `yaml:"max_len"`
}

func defaultRedis() Redis {
	return Redis{Addr: "127.0.0.1:6379", KeyPrefix: "sluice:", Timeout: 3 * time.Second, RequestTimeout: time.Second}
}

func defaultEvents() Events {
	return Events{
		TTL:    time.Hour,
		MaxLen: 20000,
	}
}

func (r Redis) validate(v *validator) {
	v.nonEmpty("redis.addr", r.Addr)
	if r.DB < 0 {
		v.add("redis.db", "must be >= 0, got %d", r.DB)
	}
	v.duration("redis.timeout", r.Timeout)
	v.duration("redis.request_timeout", r.RequestTimeout)
}

func (e Events) validate(v *validator) {
	v.duration("events.ttl", e.TTL)
	v.positive("events.max_len", e.MaxLen)
}
