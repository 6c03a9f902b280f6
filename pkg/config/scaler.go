package config

import "time"

// Scaler kinds.
const (
	ScalerNone       = "none"
	ScalerSimulator  = "simulator"
	ScalerWebhook    = "webhook"
	ScalerKubernetes = "kubernetes"
)

// Scaler is how the healer asks a pool for more replicas (pkg/scaler).
type Scaler struct {
	// Kind is none (the healer never scales the pool), simulator (llmsim's
	// POST /admin/config), webhook (POST {pool, replicas, reason} to URL)
	// or kubernetes (a Deployment's scale subresource).
	Kind string `yaml:"kind"`
	// URL is the simulator's base URL or the webhook's.
	URL string `yaml:"url"`
	// StatusURL (webhook) answers GET with {"replicas": N}; optional.
	StatusURL string `yaml:"status_url"`
	// Token (webhook) is sent as a bearer token.
	Token string `yaml:"token"`
	// APIServer, Namespace and Deployment (kubernetes) name the
	// Deployment; the API server and namespace default to the pod's own.
	APIServer  string `yaml:"api_server"`
	Namespace  string `yaml:"namespace"`
	Deployment string `yaml:"deployment"`
	// BaseReplicas is the pool's normal count, which the healer returns
	// to; MaxReplicas is the most it ever asks for.
	BaseReplicas int `yaml:"base_replicas"`
	MaxReplicas  int `yaml:"max_replicas"`
	// Timeout bounds one call to the scale target.
	Timeout time.Duration `yaml:"timeout"`
}

func defaultScaler() Scaler {
	return Scaler{Kind: ScalerNone, BaseReplicas: 1, Timeout: 10 * time.Second}
}

// validate checks the scaler at YAML path field. A pool that is never
// scaled needs nothing else, so none stops at the kind.
func (s Scaler) validate(v *validator, field string) {
	switch s.Kind {
	case ScalerNone:
		return
	case ScalerSimulator:
		v.httpURL(field+".url", s.URL)
	case ScalerWebhook:
		v.httpURL(field+".url", s.URL)
		v.optionalHTTPURL(field+".status_url", s.StatusURL)
	case ScalerKubernetes:
		v.nonEmpty(field+".deployment", s.Deployment)
		v.optionalHTTPURL(field+".api_server", s.APIServer)
	default:
		v.add(field+".kind", "must be none, simulator, webhook or kubernetes, got %q", s.Kind)
		return
	}
	v.positive(field+".base_replicas", int64(s.BaseReplicas))
	if s.MaxReplicas < s.BaseReplicas {
		v.add(field+".max_replicas", "must be at least %s.base_replicas (%d), got %d", field, s.BaseReplicas, s.MaxReplicas)
	}
	v.duration(field+".timeout", s.Timeout)
}
