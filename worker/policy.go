package worker

import (
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/policy"
)

// NewPolicy is the live traffic policy's store, starting from the
// configuration file's policy and checking every new one against the
// file's settings, as the file's own is checked.
func NewPolicy(rdb redis.UniversalClient, cfg config.Config, gate policy.PoolLimiter, logger *slog.Logger) *policy.Store {
	return policy.NewStore(rdb, policy.Options{
		KeyPrefix: cfg.Redis.KeyPrefix, Base: cfg.Policy(), Gate: gate, Validate: cfg.PolicyDeployment().Check, Logger: logger,
	})
}
