package config

import (
	"maps"
	"time"

	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
)

// Limits are the live policy's tiers (limits.enabled, limits.default_tier
// and limits.tiers.*, of pkg/policy's vocabulary), which the admin API and
// the healer change at run time, and the bans, which they do not.
type Limits struct {
	policy.Limits `yaml:",inline"`
	// Ban turns away floods; unlike the tiers it is not part of the live
	// policy.
	Ban Ban `yaml:"ban"`
}

func defaultLimits() Limits {
	return Limits{Ban: defaultBan(), Limits: policy.Limits{
		Enabled:     true,
		DefaultTier: "standard",
		Tiers: map[string]policy.Tier{
			"free": {
				Weight: 2, MaxWait: 15 * time.Second, MaxQueuePerTenant: 100, MaxConcurrent: 2, MaxOutputTokens: 512,
				Tenant:      policy.Rate{TokensPerMinute: 50000, RequestsPerMinute: 100},
				User:        policy.Rate{TokensPerMinute: 20000, RequestsPerMinute: 30},
				IP:          policy.Rate{RequestsPerMinute: 120},
				Routes:      policy.RouteLimits{Reads: perMinute(300, 300), Resumes: perMinute(60, 60), Ingest: perMinute(20, 20)},
				IngestQuota: policy.IngestQuota{Documents: 1000, Bytes: 20 << 20},
				FileQuota:   policy.FileQuota{Bytes: 100 << 20},
			},
			"standard": {
				Weight: 3, MaxQueuePerTenant: 1000,
				Tenant:       policy.Rate{TokensPerMinute: 200000, RequestsPerMinute: 300},
				User:         policy.Rate{TokensPerMinute: 60000, RequestsPerMinute: 120},
				IP:           policy.Rate{RequestsPerMinute: 600},
				Routes:       policy.RouteLimits{Reads: perMinute(1200, 600), Resumes: perMinute(300, 300), Ingest: perMinute(120, 120)},
				IngestQuota:  policy.IngestQuota{Documents: 100000, Bytes: 2 << 30},
				FileQuota:    policy.FileQuota{Bytes: 10 << 30},
				DefaultClass: request.ClassDefault,
				Classes: map[string]policy.ClassLimits{
					request.ClassDefault: {Weight: 3},
					request.ClassFlex:    {Weight: 1},
				},
			},
			"vip": {
				Weight: 5, MaxWait: 60 * time.Second, MaxQueuePerTenant: 5000,
				Tenant: policy.Rate{TokensPerMinute: 1000000, RequestsPerMinute: 1000},
				Routes: policy.RouteLimits{Reads: perMinute(6000, 0), Resumes: perMinute(1200, 0), Ingest: perMinute(600, 0)},
				Classes: map[string]policy.ClassLimits{
					request.ClassPriority: {Weight: 8, TTFTSLO: time.Second, TPOTSLO: 100 * time.Millisecond},
					request.ClassDefault:  {Weight: 5},
					request.ClassFlex:     {Weight: 2},
				},
			},
		},
	}}
}

// perMinute is a route's rate: requests per minute per tenant and per IP.
func perMinute(tenant, ip float64) policy.RouteRate {
	return policy.RouteRate{TenantPerMinute: tenant, IPPerMinute: ip}
}

// validate checks the bans. The tiers are checked with the rest of the
// live policy, by pkg/policy against the file's settings
// (PolicyDeployment), as a policy put at run time is.
func (l Limits) validate(v *validator) {
	if l.Ban.Enabled {
		l.Ban.validate(v, "limits.ban")
	}
}

// Policy is the live policy the file describes: limits.* but the bans,
// and each pool's max_concurrency.
func (c Config) Policy() policy.Policy {
	l := c.Limits.Limits
	l.Tiers = maps.Clone(l.Tiers)
	return policy.Policy{Limits: l, Pools: map[string]int{
		request.PoolShort: c.Pools.Short.MaxConcurrency, request.PoolLong: c.Pools.Long.MaxConcurrency,
	}}
}

// PolicyDeployment is what the live policy is checked against besides
// itself: the file's settings it must fit.
func (c Config) PolicyDeployment() policy.Deployment {
	d := policy.Deployment{MaxTokensLimit: c.API.MaxTokensLimit, Models: map[string]string{}, Priced: map[string]bool{},
		Ledger: c.Usage.Store, HasLedger: c.Usage.Enabled()}
	for _, k := range c.Auth.APIKeys {
		d.KeyTiers = append(d.KeyTiers, k.Tier)
	}
	if c.Pools.SharesBackends() && c.Pools.Shared.MaxConcurrency > 0 {
		d.SharedPermits = c.Pools.Shared.MaxConcurrency
	}
	for name, p := range c.Pools.ByName() {
		d.Models[name] = p.Model
	}
	for model := range c.Prices {
		d.Priced[model] = true
	}
	return d
}
