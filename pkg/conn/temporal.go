package conn

import (
	"go.temporal.io/sdk/client"
)

// Temporal says how to reach the Temporal frontend.
type Temporal struct {
	HostPort, Namespace string
	// APIKey, if set, is sent as bearer credentials.
	APIKey string
	TLS    TLS
}

// TemporalOptions turns cfg into client options: address, namespace, API
// key (as bearer credentials) and TLS. Logger, metrics and the like are
// the caller's to add.
func TemporalOptions(cfg Temporal) (client.Options, error) {
	o := client.Options{HostPort: cfg.HostPort, Namespace: cfg.Namespace}
	if cfg.APIKey != "" {
		o.Credentials = client.NewAPIKeyStaticCredentials(cfg.APIKey)
	}
	if cfg.TLS.Enabled {
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
