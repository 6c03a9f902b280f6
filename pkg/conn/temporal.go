package conn

import (
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/pkg/config"
)

// TemporalOptions turns cfg into client options: address, namespace, API
// key (as bearer credentials) and TLS. cfg is expected to come from
// config.Load, which has already layered TEMPORAL_* variables and the
// Temporal profile under Sluice's own settings. Logger, metrics and the
// like are the caller's to add.
func TemporalOptions(cfg config.Temporal) (client.Options, error) {
	if err := cfg.Validate(); err != nil {
		return client.Options{}, err
	}
	o := client.Options{HostPort: cfg.HostPort, Namespace: cfg.Namespace}
	if cfg.APIKey != "" {
		o.Credentials = client.NewAPIKeyStaticCredentials(cfg.APIKey)
	}
	if cfg.UsesTLS() {
		tc, err := TLSConfig(cfg.TLS, "temporal.tls")
		if err != nil {
			return client.Options{}, err
		}
		o.ConnectionOptions.TLS = tc
	} else {
		// Else the SDK turns TLS on for an API key by itself, overruling
		// an explicit temporal.tls.enabled: false.
		o.ConnectionOptions.TLSDisabled = true
	}
	return o, nil
}
