package conn

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisPoolSize is the connections per Redis node: streams, scripts and
// blocking reads from many requests at once.
const redisPoolSize = 256

// Redis says how to reach Redis: one of Addr, Addrs, URL and Sentinel.
type Redis struct {
	// Addr is one server's host:port.
	Addr string
	// Addrs are seed nodes of a Redis Cluster.
	Addrs []string
	// URL is redis[s]://[user[:password]@]host[:port][/db]; each
	// ?addr=host:port adds a cluster seed (then Cluster is set).
	URL string
	// Cluster says that Addrs or URL name a Redis Cluster.
	Cluster bool
	// Username and Password authenticate; a URL's own win.
	Username, Password string
	// DB selects a database (a URL's own wins).
	DB int
	// TLS of every connection, to sentinels too.
	TLS TLS
	// Sentinel finds the current primary of a replicated Redis.
	Sentinel Sentinel
	// Timeout bounds connecting and every command.
	Timeout time.Duration
}

// Sentinel names a primary and the sentinels that watch it.
type Sentinel struct {
	MasterName string
	Addrs      []string
	// Username and Password authenticate to the sentinels.
	Username, Password string
}

// NewRedis builds the Redis client cfg describes: a single-node client
// (Addr, or a URL without ?addr=), a cluster client (Addrs, or a URL with
// ?addr= seeds) or a Sentinel-backed failover client. It does not
// connect; the first command does.
func NewRedis(cfg Redis) (redis.UniversalClient, error) {
	o, err := RedisOptions(cfg)
	if err != nil {
		return nil, err
	}
	return redis.NewUniversalClient(o), nil
}

// RedisOptions is what NewRedis hands go-redis, from a cfg its caller has
// validated. A cluster is marked with IsClusterMode, so that one seed
// address still gets a cluster client.
func RedisOptions(cfg Redis) (*redis.UniversalOptions, error) {
	o := &redis.UniversalOptions{
		Username: cfg.Username, Password: cfg.Password, DB: cfg.DB,
		PoolSize:    redisPoolSize,
		DialTimeout: cfg.Timeout, ReadTimeout: cfg.Timeout, WriteTimeout: cfg.Timeout,
		// A caller's deadline (the door's request_timeout) bounds the
		// network wait too, not only the wait for a connection.
		ContextTimeoutEnabled: true,
	}
	switch {
	case cfg.Sentinel.MasterName != "":
		o.MasterName, o.Addrs = cfg.Sentinel.MasterName, cfg.Sentinel.Addrs
		o.SentinelUsername, o.SentinelPassword = cfg.Sentinel.Username, cfg.Sentinel.Password
	case len(cfg.Addrs) > 0:
		o.Addrs, o.IsClusterMode = cfg.Addrs, true
	case cfg.URL != "":
		if err := fromURL(o, cfg); err != nil {
			return nil, err
		}
	default:
		o.Addrs = []string{cfg.Addr}
	}
	if cfg.TLS.Enabled {
		var err error
		if o.TLSConfig, err = TLSConfig(cfg.TLS, "redis.tls"); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// fromURL takes the addresses, credentials and database of cfg.URL; the
// url's user and password win over cfg's, which config validation allows
// only to fill in what the url lacks. TLS is cfg.TLS, which the caller
// has set from the url's scheme.
func fromURL(o *redis.UniversalOptions, cfg Redis) error {
	var user, password string
	if cfg.Cluster {
		co, err := redis.ParseClusterURL(cfg.URL)
		if err != nil {
			return urlError(err)
		}
		o.Addrs, o.IsClusterMode, user, password = co.Addrs, true, co.Username, co.Password
	} else {
		so, err := redis.ParseURL(cfg.URL)
		if err != nil {
			return urlError(err)
		}
		o.Addrs, o.DB, user, password = []string{so.Addr}, so.DB, so.Username, so.Password
		if o.DB == 0 {
			o.DB = cfg.DB
		}
	}
	if user != "" {
		o.Username = user
	}
	if password != "" {
		o.Password = password
	}
	return nil
}

// urlError reports a bad redis.url without quoting it: it may hold a
// password.
func urlError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return errors.New("redis.url: does not parse as a URL")
	}
	return fmt.Errorf("redis.url: %w", err)
}

// RedisTarget says which Redis cfg points at, for logs and errors, without
// secrets.
func RedisTarget(cfg Redis) string {
	switch {
	case cfg.Sentinel.MasterName != "":
		return fmt.Sprintf("primary %q via sentinels %s (redis.sentinel)", cfg.Sentinel.MasterName, strings.Join(cfg.Sentinel.Addrs, ","))
	case len(cfg.Addrs) > 0:
		return fmt.Sprintf("cluster %s (redis.addrs)", strings.Join(cfg.Addrs, ","))
	case cfg.URL != "":
		if u, err := url.Parse(cfg.URL); err == nil {
			return u.Redacted() + " (redis.url)"
		}
		return "an unparseable redis.url"
	}
	return cfg.Addr + " (redis.addr)"
}
