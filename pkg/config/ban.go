package config

import (
	"net/netip"
	"time"

	"github.com/sluice-dev/sluice/pkg/ban"
	"github.com/sluice-dev/sluice/pkg/iphash"
)

// Ban configures abuse bans: an IP or an API key that earns more than
// Threshold strikes within Window is refused everywhere (429 with
// Retry-After) for Duration. A strike is what abuse looks like: a request
// refused for a bad or unknown credential, or one that comes back while a
// rate limit's Retry-After is in force (after a grace of a second for
// requests already on their way). Admitted requests never count, so a
// client within its plan is never banned whatever its rate: rate limits
// decide how much a well-behaved client may spend; a ban is for one that
// ignores its 429s or guesses keys.
type Ban struct {
	Enabled   bool          `yaml:"enabled"`
	Threshold int           `yaml:"threshold"`
	Window    time.Duration `yaml:"window"`
	Duration  time.Duration `yaml:"duration"`
	// Exempt are networks (CIDR) never counted or banned by address. By
	// default loopback: behind a proxy on the same host not listed in
	// api.trusted_proxies every client is 127.0.0.1, and one ban would
	// shut them all out. Their keys are still counted.
	Exempt []string `yaml:"exempt"`
}

func defaultBan() Ban {
	return Ban{Enabled: true, Threshold: 50, Window: 10 * time.Second, Duration: 5 * time.Minute,
		Exempt: []string{"127.0.0.0/8", "::1/128"}}
}

// ExemptPrefixes are Exempt parsed; the configuration is validated, so
// they parse.
func (b Ban) ExemptPrefixes() []netip.Prefix { return prefixes(b.Exempt) }

// GuardOptions are the ban guard these settings describe, its keys under
// keyPrefix (redis.key_prefix), naming addresses by addresses. The grace
// is ban.DefaultGrace: it covers requests in flight, not a policy.
func (b Ban) GuardOptions(keyPrefix string, addresses *iphash.Hasher) ban.Options {
	return ban.Options{KeyPrefix: keyPrefix, Threshold: b.Threshold, Window: b.Window, Duration: b.Duration,
		Exempt: b.ExemptPrefixes(), Addresses: addresses}
}

func (b Ban) validate(v *validator, field string) {
	v.positive(field+".threshold", int64(b.Threshold))
	if b.Window < time.Second {
		v.add(field+".window", "must be at least 1s, got %s", b.Window)
	}
	if b.Duration < time.Second {
		v.add(field+".duration", "must be at least 1s, got %s", b.Duration)
	}
	v.networks(field+".exempt", b.Exempt)
}
