// Package conn opens Sluice's connections to Redis and Temporal. It is the
// one place where addresses, credentials and TLS settings become clients,
// so that every process connects the same way.
package conn

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// TLS is the TLS of a connection.
type TLS struct {
	// Enabled turns TLS on; the other fields matter only then.
	Enabled bool
	// CAFile is a PEM bundle of the CAs the server's certificate must
	// chain to; empty: the system's roots.
	CAFile string
	// CertFile and KeyFile are a client certificate and its key (PEM).
	CertFile, KeyFile string
	// ServerName is the name the server's certificate must carry; empty:
	// the host dialled.
	ServerName string
	// InsecureSkipVerify accepts any server certificate (a development
	// server's throwaway one).
	InsecureSkipVerify bool
}

// TLSConfig builds the crypto/tls configuration of t; path names the
// section (redis.tls, temporal.tls) in errors. Files are read once, here:
// a rotated certificate takes a restart.
func TLSConfig(t TLS, path string) (*tls.Config, error) {
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: t.ServerName,
		// Opt-in, named dev_only in the configuration, and warned about
		// at start.
		InsecureSkipVerify: t.InsecureSkipVerify,
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%s.ca_file: %w", path, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.ca_file: %s holds no PEM certificate", path, t.CAFile)
		}
		c.RootCAs = pool
	}
	if t.CertFile != "" || t.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s.cert_file and %s.key_file: %w", path, path, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
