package config

import (
	"net/url"
	"strings"
	"time"
)

// Database is where a kind of record is kept (pkg/sqldb): off, sqlite
// (one file: the dev stack, a single host) or postgres (every API and
// worker of a deployment shares it).
type Database struct {
	Store string `yaml:"store"`
	// SQLitePath is the SQLite file (store sqlite); the API and the
	// worker on the host open the same one.
	SQLitePath string `yaml:"sqlite_path"`
	// PostgresDSN is the records' database (store postgres), e.g.
	// postgres://sluice@db:5432/sluice_usage?sslmode=verify-full. It
	// carries a password: keep it in the environment
	// (SLUICE_<SECTION>_POSTGRES_DSN).
	PostgresDSN string `yaml:"postgres_dsn"`
}

// A Database's backends (its store).
const (
	StoreOff      = "off"
	StoreSQLite   = "sqlite"
	StorePostgres = "postgres"
)

// Enabled reports whether the records are kept.
func (d Database) Enabled() bool { return d.Store != StoreOff }

// validate checks d, the database of section (usage, responses).
func (d Database) validate(v *validator, section string) {
	switch d.Store {
	case StoreOff:
	case StoreSQLite:
		v.nonEmpty(section+".sqlite_path", d.SQLitePath)
	case StorePostgres:
		if !validPostgresDSN(d.PostgresDSN) {
			// Not the value: it may hold a password.
			v.add(section+".postgres_dsn", "must be a postgres:// URL or libpq key=value pairs naming a host (store postgres)")
		}
	default:
		v.add(section+".store", "must be off, sqlite or postgres, got %q", d.Store)
	}
	if d.Store != StoreSQLite && d.SQLitePath != "" {
		v.add(section+".sqlite_path", "is for %s.store sqlite, got store %q", section, d.Store)
	}
	if d.Store != StorePostgres && d.PostgresDSN != "" {
		v.add(section+".postgres_dsn", "is for %s.store postgres, got store %q", section, d.Store)
	}
}

// Usage is the usage ledger: one record per finished request (pkg/usage),
// read back by GET /v1/usage and the admins' GET /v1/admin/usage. Off:
// nothing is recorded and the usage routes answer 404.
type Usage struct {
	Database `yaml:",inline"`
}

// The ledger's backends (usage.store).
const (
	UsageOff      = StoreOff
	UsageSQLite   = StoreSQLite
	UsagePostgres = StorePostgres
)

func defaultUsage() Usage { return Usage{Database{Store: UsageOff}} }

func (u Usage) validate(v *validator) { u.Database.validate(v, "usage") }

// Responses keeps the Responses API's stored responses (pkg/responses):
// what GET /v1/responses/{id} reads and previous_response_id continues.
// Off: no response is stored, and store or previous_response_id is
// refused.
type Responses struct {
	Database `yaml:",inline"`
	// MaxChain bounds the responses one previous_response_id reaches back
	// through.
	MaxChain int `yaml:"max_chain"`
	// BackgroundMaxWait bounds a background response's wait for a permit,
	// in place of its tier's max_wait: no client is held open by it, and
	// it waits in its pool's queue, not at the door, so it may wait
	// longer than a client would; its tenant's queue cap still bounds how
	// many wait.
	BackgroundMaxWait time.Duration `yaml:"background_max_wait"`
}

func defaultResponses() Responses {
	return Responses{Database: Database{Store: StoreOff}, MaxChain: 100, BackgroundMaxWait: 10 * time.Minute}
}

func (r Responses) validate(v *validator) {
	r.Database.validate(v, "responses")
	v.positive("responses.max_chain", int64(r.MaxChain))
	v.duration("responses.background_max_wait", r.BackgroundMaxWait)
}

// Files keeps uploaded files (pkg/files): the JSONL inputs of batches,
// and the batches' output files. Off: /v1/files answers 404.
type Files struct {
	Database `yaml:",inline"`
	// MaxBytes and MaxLines bound one file, as OpenAI's batch input
	// (200 MB, 50,000 requests).
	MaxBytes int64 `yaml:"max_bytes"`
	MaxLines int   `yaml:"max_lines"`
	// UploadTimeout bounds an upload's body, in place of
	// api.body_read_timeout: a file of MaxBytes takes longer than a chat
	// request's body.
	UploadTimeout time.Duration `yaml:"upload_timeout"`
}

func defaultFiles() Files {
	return Files{Database: Database{Store: StoreOff}, MaxBytes: 200 << 20, MaxLines: 50_000, UploadTimeout: 10 * time.Minute}
}

func (f Files) validate(v *validator) {
	f.Database.validate(v, "files")
	v.positive("files.max_bytes", f.MaxBytes)
	v.positive("files.max_lines", int64(f.MaxLines))
	v.duration("files.upload_timeout", f.UploadTimeout)
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
