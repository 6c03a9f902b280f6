package conn

import (
	"errors"

	"go.temporal.io/api/serviceerror"
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

// NotFound reports whether err is the Temporal server saying that what a
// call named does not exist: a workflow that never started, or one whose
// history is gone.
func NotFound(err error) bool {
	var nf *serviceerror.NotFound
	return errors.As(err, &nf)
}
