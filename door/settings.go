package door

import (
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/workflows"
)

// ChatSettings is what a request of tier runs with under cfg: copied
// into its workflow input when the door starts it, so that a later config
// change never alters it. Its Weight is the tier's; the door replaces it,
// and sets the SLOs, from the service class the request is served in.
func ChatSettings(cfg config.Config, tier policy.Tier) workflows.ChatSettings {
	maxWait := cfg.Admission.MaxWait
	var byPool map[string]time.Duration
	if tier.MaxWait > 0 {
		maxWait = tier.MaxWait
	} else {
		pools := cfg.Pools.ByName()
		for _, name := range request.Pools() {
			if d := pools[name].MaxWait; d > 0 {
				if byPool == nil {
					byPool = map[string]time.Duration{}
				}
				byPool[name] = d
			}
		}
	}
	return workflows.ChatSettings{
		MaxWait:          maxWait,
		MaxWaitByPool:    byPool,
		RecheckInterval:  cfg.Admission.RecheckInterval,
		FastWait:         cfg.Admission.FastWait,
		DisconnectGrace:  cfg.API.DisconnectGrace,
		TopK:             cfg.Retrieval.TopK,
		Candidates:       cfg.Retrieval.Candidates,
		LLMTimeout:       cfg.LLM.Timeout,
		LLMHeartbeat:     cfg.LLM.HeartbeatTimeout,
		LLMMaxAttempts:   cfg.LLM.MaxAttempts,
		SearchAttributes: cfg.Temporal.SearchAttributes,
		Weight:           tier.Weight,
		MaxPerTenant:     tier.MaxQueuePerTenant,
		MaxConcurrent:    tier.MaxConcurrent,
		HistoryTokens:    cfg.Sessions.HistoryTokens,
		RecordUsage:      cfg.Usage.Enabled(),
		Fallbacks:        fallbacks(cfg.Pools),
	}
}

// fallbacks is each pool's fallbacks, with a fallback pool's model
// named, so that the workflow can say which model it moves to.
func fallbacks(p config.Pools) map[string][]workflows.Fallback {
	var out map[string][]workflows.Fallback
	pools := p.ByName()
	for _, name := range request.Pools() {
		for _, f := range pools[name].Fallbacks {
			fb := workflows.Fallback{Pool: f.Pool, Model: f.Model}
			if f.Pool != "" {
				fb.Model = pools[f.Pool].Model
			}
			if out == nil {
				out = map[string][]workflows.Fallback{}
			}
			out[name] = append(out[name], fb)
		}
	}
	return out
}
