package config

// TLS configures the TLS of a connection Sluice opens (redis.tls,
// temporal.tls). pkg/conn turns it into a crypto/tls configuration.
type TLS struct {
	// Enabled turns TLS on or off. Left unset, TLS is on when any field
	// below is set, or when something else asks for it: a rediss:// URL, a
	// Temporal API key, TEMPORAL_TLS. A pointer, so that an explicit false
	// can overrule those.
	Enabled *bool `yaml:"enabled"`
	// CAFile is a PEM bundle of the CAs the server's certificate must chain
	// to; empty: the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a client certificate and its key (PEM), for
	// servers that require mutual TLS.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name the server's certificate must carry; empty:
	// the host dialled.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerifyDevOnly accepts any server certificate. Only for a
	// development server with a throwaway certificate: with it, anyone on
	// the network path can read and change the traffic.
	InsecureSkipVerifyDevOnly bool `yaml:"insecure_skip_verify_dev_only"`
}

// settingsGiven reports whether any field besides Enabled is set.
func (t TLS) settingsGiven() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != "" || t.InsecureSkipVerifyDevOnly
}

// On reports whether the connection uses TLS; implied is whether something
// outside this section asks for it (a rediss:// URL, an API key).
func (t TLS) On(implied bool) bool {
	if t.Enabled != nil {
		return *t.Enabled
	}
	return implied || t.settingsGiven()
}

// validate checks the section at path (redis.tls, temporal.tls).
func (t TLS) validate(v *validator, path string) {
	if t.Enabled != nil && !*t.Enabled && t.settingsGiven() {
		v.add(path+".enabled", "is false, but other %s settings are given; remove them or the false", path)
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		v.add(path+".key_file", "must be set with %s.cert_file (a client certificate needs its key)", path)
	case t.KeyFile != "" && t.CertFile == "":
		v.add(path+".cert_file", "must be set with %s.key_file (a client key needs its certificate)", path)
	}
}

// Bool returns a pointer to b, for the tri-state TLS.Enabled.
func Bool(b bool) *bool { return &b }
