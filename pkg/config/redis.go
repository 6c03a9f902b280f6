package config

import (
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Redis says how to reach the one Redis that holds permits, queues, caches
// and event streams: a server, a Redis Cluster or a primary that Sentinel
// watches. Set one of addr, addrs, url and sentinel; with none set, addr is
// defaultRedisAddr.
type Redis struct {
	// Addr is one Redis server's host:port.
	Addr string `yaml:"addr"`
	// Addrs are seed nodes of a Redis Cluster (host:port; one is enough,
	// the client finds the others). Set, Sluice uses a cluster client, even
	// with one address.
	Addrs []string `yaml:"addrs"`
	// URL is redis://[user[:password]@]host[:port][/db], or rediss:// for
	// TLS. Each ?addr=host:port adds a seed node and makes it a cluster.
	URL string `yaml:"url"`
	// Username and Password authenticate: an ACL user, or the password
	// alone for requirepass. Either may complete a url that lacks it, so
	// that the secret can stay in SLUICE_REDIS_PASSWORD.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// DB selects a database; a Redis Cluster has only 0.
	DB int `yaml:"db"`
	// TLS of every connection (to sentinels too). With a url, the scheme
	// turns it on (rediss://) or off (redis://); these settings refine it.
	TLS TLS `yaml:"tls"`
	// Sentinel finds the current primary of a replicated Redis.
	Sentinel Sentinel `yaml:"sentinel"`
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

// Sentinel names a primary and the sentinels that watch it; the client
// asks them where the primary is and follows failovers.
type Sentinel struct {
	MasterName string   `yaml:"master_name"`
	Addrs      []string `yaml:"addrs"`
	// Username and Password authenticate to the sentinels, which may have
	// other credentials than the data nodes (redis.username, redis.password).
	Username string `yaml:"username"`
	Password string `yaml:"password"`
}

// Events configures the per-request Redis Streams that carry SSE events.
type Events struct {
	// TTL is how long a request's event stream stays readable after its last
	// event, so that a client can reconnect with Last-Event-ID.
	TTL time.Duration `yaml:"ttl"`
	// MaxLen caps the entries of one stream (approximate trimming).
	MaxLen int64 `yaml:"max_len"`
}

const defaultRedisAddr = "127.0.0.1:6379"

func defaultRedis() Redis {
	return Redis{Addr: defaultRedisAddr, KeyPrefix: "sluice:", Timeout: 3 * time.Second, RequestTimeout: time.Second}
}

func defaultEvents() Events {
	return Events{
		TTL:    time.Hour,
		MaxLen: 20000,
	}
}

// Cluster reports whether Redis is a Redis Cluster: redis.addrs, or a url
// with ?addr= seeds.
func (r Redis) Cluster() bool {
	if len(r.Addrs) > 0 {
		return true
	}
	if u, err := url.Parse(r.URL); r.URL != "" && err == nil {
		return u.Query().Has("addr")
	}
	return false
}

// UsesTLS reports whether connections to Redis use TLS.
func (r Redis) UsesTLS() bool {
	if r.URL != "" {
		return strings.HasPrefix(strings.ToLower(r.URL), "rediss://")
	}
	return r.TLS.On(false)
}

// ways lists the settings that say where Redis is, as YAML paths.
func (r Redis) ways() []string {
	var ways []string
	if r.Addr != "" {
		ways = append(ways, "redis.addr")
	}
	if len(r.Addrs) > 0 {
		ways = append(ways, "redis.addrs")
	}
	if r.URL != "" {
		ways = append(ways, "redis.url")
	}
	if r.Sentinel.MasterName != "" || len(r.Sentinel.Addrs) > 0 {
		ways = append(ways, "redis.sentinel")
	}
	return ways
}

// fillDefaultAddr points Redis at defaultRedisAddr when nothing else says
// where it is. Load applies it after the file and the environment, so that
// a url or a cluster is not also given the default addr.
func (r *Redis) fillDefaultAddr() {
	if len(r.ways()) == 0 {
		r.Addr = defaultRedisAddr
	}
}

// Validate checks this section alone, as Config.Validate does.
func (r Redis) Validate() error {
	var v validator
	r.validate(&v)
	return v.err()
}

func (r Redis) validate(v *validator) {
	switch ways := r.ways(); len(ways) {
	case 0:
		v.add("redis.addr", "must not be empty (or set one of redis.addrs, redis.url, redis.sentinel)")
	case 1:
	default:
		v.add(ways[1], "set only one of redis.addr, redis.addrs, redis.url and redis.sentinel; %s is set too", ways[0])
	}
	if r.Addr != "" {
		v.hostPort("redis.addr", r.Addr)
	}
	if strings.ContainsAny(r.KeyPrefix, "{}") {
		// Keys carry hash tags after the prefix ({adm:short}, {t:acme}):
		// a brace in the prefix would become the tag, and every key of
		// every script one slot, or keys of one script several.
		v.add("redis.key_prefix", "must not contain { or }: Sluice puts Redis Cluster hash tags after it, got %q", r.KeyPrefix)
	}
	for i, a := range r.Addrs {
		v.hostPort("redis.addrs["+strconv.Itoa(i)+"]", a)
	}
	if r.URL != "" {
		r.validateURL(v)
	}
	r.Sentinel.validate(v)
	if r.DB < 0 {
		v.add("redis.db", "must be >= 0, got %d", r.DB)
	}
	if r.Cluster() && r.DB != 0 {
		v.add("redis.db", "must be 0 with a Redis Cluster (redis.addrs, or a redis.url with ?addr=), which has only database 0, got %d", r.DB)
	}
	r.TLS.validate(v, "redis.tls")
	v.duration("redis.timeout", r.Timeout)
	v.duration("redis.request_timeout", r.RequestTimeout)
}

// validateURL checks redis.url and what it carries against the fields it
// would contradict. Messages show the URL without its password.
func (r Redis) validateURL(v *validator) {
	u, err := url.Parse(r.URL)
	if err != nil {
		// url.Parse's error quotes the whole URL, password included.
		v.add("redis.url", "must be a redis:// or rediss:// URL; it does not parse")
		return
	}
	if s := strings.ToLower(u.Scheme); s != "redis" && s != "rediss" {
		v.add("redis.url", "must be a redis:// or rediss:// URL, got %q", u.Redacted())
		return
	}
	if u.Hostname() == "" {
		v.add("redis.url", "must name a host (redis://host:port), got %q", u.Redacted())
	}
	if u.Port() != "" {
		if _, err := strconv.ParseUint(u.Port(), 10, 16); err != nil {
			v.add("redis.url", "has a bad port in %q", u.Redacted())
		}
	}
	db, hasDB := 0, false
	if p := strings.Trim(u.Path, "/"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			v.add("redis.url", "path must be a database number such as /0, got %q", u.Path)
		}
		db, hasDB = n, true
	}
	for name, vals := range u.Query() {
		if name != "addr" {
			v.add("redis.url", "query parameter %q is not supported (only addr, a cluster seed; timeouts and pools come from redis.timeout)", name)
			continue
		}
		for _, a := range vals {
			v.hostPort("redis.url", a)
		}
	}
	if hasDB && db != 0 && u.Query().Has("addr") {
		v.add("redis.url", "must select database 0 (or none) with ?addr= seeds: a Redis Cluster has only database 0, got /%d", db)
	}
	if hasDB && r.DB != 0 {
		v.add("redis.db", "must not be set when redis.url selects a database (%s)", u.Path)
	}
	if u.User != nil && u.User.Username() != "" && r.Username != "" {
		v.add("redis.username", "must not be set when redis.url carries a user")
	}
	if _, has := u.User.Password(); has && r.Password != "" {
		v.add("redis.password", "must not be set when redis.url carries a password")
	}
	tlsURL := strings.EqualFold(u.Scheme, "rediss")
	switch {
	case r.TLS.Enabled != nil && *r.TLS.Enabled != tlsURL:
		v.add("redis.tls.enabled", "is %t, but redis.url is %s://; the scheme says whether to use TLS", *r.TLS.Enabled, u.Scheme)
	case !tlsURL && r.TLS.settingsGiven():
		v.add("redis.tls", "settings are given, but redis.url is redis://, without TLS; use rediss://")
	}
}

func (s Sentinel) validate(v *validator) {
	given := len(s.Addrs) > 0 || s.Username != "" || s.Password != ""
	if s.MasterName == "" && given {
		v.add("redis.sentinel.master_name", "must name the primary that the sentinels watch")
	}
	if s.MasterName != "" && len(s.Addrs) == 0 {
		v.add("redis.sentinel.addrs", "must list the sentinels (host:port) that watch %q", s.MasterName)
	}
	for i, a := range s.Addrs {
		v.hostPort("redis.sentinel.addrs["+strconv.Itoa(i)+"]", a)
	}
}

func (e Events) validate(v *validator) {
	v.duration("events.ttl", e.TTL)
	v.positive("events.max_len", e.MaxLen)
}

// hostPortOK reports whether s is host:port with a host and a numeric port.
func hostPortOK(s string) bool {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return false
	}
	_, err = strconv.ParseUint(port, 10, 16)
	return err == nil
}
