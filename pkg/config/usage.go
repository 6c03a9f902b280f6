package config

import (
	"net/url"
	"strings"
)

// Usage is the usage ledger: one record per finished request (pkg/usage),
// read back by GET /v1/usage and the admins' GET /v1/admin/usage.
type Usage struct {
	// Store is off, sqlite (one file: the dev stack, a single host) or
	// postgres (every API and worker of a deployment shares it). Off:
	// nothing is recorded and the usage routes answer 404.
	Store string `yaml:"store"`
	// SQLitePath is the SQLite file (store sqlite); the API and the
	// worker on the host open the same one.
	SQLitePath string `yaml:"sqlite_path"`
	// PostgresDSN is the ledger's own database (store postgres), e.g.
	// postgres://sluice@db:5432/sluice_usage?sslmode=verify-full. It
	// carries a password: keep it in SLUICE_USAGE_POSTGRES_DSN.
	PostgresDSN string `yaml:"postgres_dsn"`
}

// The ledger's backends (usage.store).
const (
	UsageOff      = "off"
	UsageSQLite   = "sqlite"
	UsagePostgres = "postgres"
)

func defaultUsage() Usage { return Usage{Store: UsageOff} }

// Enabled reports whether requests are recorded.
func (u Usage) Enabled() bool { return u.Store != UsageOff }

func (u Usage) validate(v *validator) {
	switch u.Store {
	case UsageOff:
	case UsageSQLite:
		v.nonEmpty("usage.sqlite_path", u.SQLitePath)
	case UsagePostgres:
		if !validPostgresDSN(u.PostgresDSN) {
			// Not the value: it may hold a password.
			v.add("usage.postgres_dsn", "must be a postgres:// URL or libpq key=value pairs naming a host (store postgres)")
		}
	default:
		v.add("usage.store", "must be off, sqlite or postgres, got %q", u.Store)
	}
	if u.Store != UsageSQLite && u.SQLitePath != "" {
		v.add("usage.sqlite_path", "is for usage.store sqlite, got store %q", u.Store)
	}
	if u.Store != UsagePostgres && u.PostgresDSN != "" {
		v.add("usage.postgres_dsn", "is for usage.store postgres, got store %q", u.Store)
	}
}

// validPostgresDSN accepts what pgx takes: a postgres:// or postgresql://
// URL with a host, or key=value pairs with host=.
func validPostgresDSN(dsn string) bool {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		return err == nil && u.Host != ""
	}
	for _, f := range strings.Fields(dsn) {
		if strings.HasPrefix(f, "host=") && len(f) > len("host=") {
			return true
		}
	}
	return false
}
