package app

import (
	"context"
	"fmt"
	"time"

	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"

	"github.com/sluice-dev/sluice/pkg/codec"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/conn"
	"github.com/sluice-dev/sluice/pkg/tracing"
)

// connectRedis opens the Redis client and checks that Redis answers.
func (c *Core) connectRedis(ctx context.Context) error {
	cfg := c.cfg.Redis
	if cfg.UsesTLS() && cfg.TLS.InsecureSkipVerifyDevOnly {
		c.logger.Warn("redis.tls.insecure_skip_verify_dev_only is set: the Redis server's certificate is not checked")
	}
	o, err := redisOptions(cfg)
	if err != nil {
		return err
	}
	if c.Redis, err = conn.NewRedis(o); err != nil {
		return err
	}
	if c.Tracer != nil {
		if err := tracing.InstrumentRedis(c.Redis, c.Tracer); err != nil {
			return err
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Redis.Ping(pctx).Err(); err != nil {
		return fmt.Errorf("connect to redis at %s: %w", conn.RedisTarget(o), err)
	}
	return nil
}

// redisOptions checks the redis section and puts it in pkg/conn's terms.
func redisOptions(c config.Redis) (conn.Redis, error) {
	if err := c.Validate(); err != nil {
		return conn.Redis{}, err
	}
	s := c.Sentinel
	return conn.Redis{
		Addr: c.Addr, Addrs: c.Addrs, URL: c.URL, Cluster: c.Cluster(),
		Username: c.Username, Password: c.Password, DB: c.DB, TLS: connTLS(c.TLS, c.UsesTLS()),
		Sentinel: conn.Sentinel{MasterName: s.MasterName, Addrs: s.Addrs, Username: s.Username, Password: s.Password},
		Timeout:  c.Timeout,
	}, nil
}

// temporalOptions checks the temporal section and puts where and how to
// connect in pkg/conn's terms.
func temporalOptions(c config.Temporal) (conn.Temporal, error) {
	if err := c.Validate(); err != nil {
		return conn.Temporal{}, err
	}
	return conn.Temporal{HostPort: c.HostPort, Namespace: c.Namespace, APIKey: c.APIKey, TLS: connTLS(c.TLS, c.UsesTLS())}, nil
}

// connTLS is a tls section in pkg/conn's terms; on is whether the
// connection uses TLS, which the section decides with what implies it.
func connTLS(t config.TLS, on bool) conn.TLS {
	return conn.TLS{Enabled: on, CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile,
		ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerifyDevOnly}
}

// connectTemporal opens the Temporal client; Dial checks that the
// frontend answers.
func (c *Core) connectTemporal() error {
	cfg := c.cfg.Temporal
	if cfg.UsesTLS() && cfg.TLS.InsecureSkipVerifyDevOnly {
		c.logger.Warn("temporal.tls.insecure_skip_verify_dev_only is set: the Temporal server's certificate is not checked")
	}
	to, err := temporalOptions(cfg)
	if err != nil {
		return err
	}
	opts, err := conn.TemporalOptions(to)
	if err != nil {
		return err
	}
	opts.Logger = tlog.NewStructuredLogger(c.logger.With("component", "temporal"))
	opts.MetricsHandler = c.Metrics.TemporalHandler()
	if c.Tracer != nil {
		i, err := tracing.TemporalInterceptor(c.Tracer)
		if err != nil {
			return err
		}
		opts.Interceptors = append(opts.Interceptors, i)
	}
	// With codec.enabled every payload this client (and every worker on
	// it) sends is sealed, and every one it reads opened.
	if c.Codec, err = codec.New(codecOptions(c.cfg.Codec)); err != nil {
		return err
	}
	c.Codec.Apply(&opts)
	if c.Temporal, err = client.Dial(opts); err != nil {
		return fmt.Errorf("connect to temporal at %s, namespace %s (temporal.host_port, temporal.namespace; TLS %t, API key %t): %w",
			cfg.HostPort, cfg.Namespace, cfg.UsesTLS(), cfg.APIKey != "", err)
	}
	return nil
}

// codecOptions are the codec settings as pkg/codec takes them.
func codecOptions(c config.Codec) codec.Options {
	keys := make([]codec.Key, len(c.Keys))
	for i, k := range c.Keys {
		keys[i] = codec.Key{ID: k.ID, Secret: k.Secret}
	}
	return codec.Options{Enabled: c.Enabled, ActiveKey: c.ActiveKey, Keys: keys}
}
