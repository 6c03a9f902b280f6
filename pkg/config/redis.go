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
	return Redis{Addr: "127.0.0.1:6379", KeyPrefix: "sluice:"}
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
}

func (e Events) validate(v *validator) {
	v.duration("events.ttl", e.TTL)
	v.positive("events.max_len", e.MaxLen)
}
