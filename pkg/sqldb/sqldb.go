// Package sqldb opens the SQL databases Sluice keeps records in, SQLite
// (one file: the dev stack, a single host) or PostgreSQL (shared by every
// process of a deployment), and brings each kind of record's schema up to
// date from its own versioned SQL files. The records themselves (the
// usage ledger, stored responses) are their packages'; what differs
// between the two backends, and how a schema is migrated, is here once.
package sqldb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/sluice-dev/sluice/pkg/backoff"
	// The two backends' database/sql drivers: pgx's ("pgx") and the pure
	// Go SQLite ("sqlite"), so no cgo.
	_ "github.com/jackc/pgx/v5/stdlib"
	"modernc.org/sqlite"
)

// Dialect is what differs between the backends: the driver, how
// parameters are written, and how many connections a process keeps.
type Dialect struct {
	Name   string
	driver string
	// numbered: parameters are $1, $2 (PostgreSQL), not ?.
	numbered bool
	maxConns int
}

var (
	// SQLite has one writer at a time: more connections would only queue
	// on the busy timeout.
	SQLite = Dialect{Name: "sqlite", driver: "sqlite", maxConns: 4}
	// Postgres is shared by every process of a deployment; each keeps a
	// few connections.
	Postgres = Dialect{Name: "postgres", driver: "pgx", numbered: true, maxConns: 8}
)

// Rebind writes q's ? parameters as the dialect wants them. The records'
// SQL has no ? anywhere else.
func (d Dialect) Rebind(q string) string {
	if !d.numbered {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Schema is one kind of record's tables, as its migrations build them.
type Schema struct {
	// Name names the records in errors ("usage ledger").
	Name string
	// Table is where applied migrations are recorded
	// ("usage_schema_migrations"): each kind keeps its own, so that each
	// is migrated on its own, in one database or apart.
	Table string
	// Migrations holds the NNNN_what.sql files, in Dir.
	Migrations fs.FS
	Dir        string
	// LockKey is the PostgreSQL advisory lock its migrations take: any
	// number, its own.
	LockKey int64
}

// DB is a database opened for one schema.
type DB struct {
	SQL     *sql.DB
	Dialect Dialect
	// Where names the database in errors (a path, or a DSN without its
	// password).
	Where  string
	schema Schema
	// migrated is set once the schema is known current; until then every
	// Migrate tries again (a PostgreSQL database may be out of reach when
	// the process starts).
	migrated  atomic.Bool
	migrating sync.Mutex
}

// SQLiteOptions open a SQLite file.
type SQLiteOptions struct {
	Path string
	// BusyTimeout is how long a write waits for another process's (the
	// API's and the worker's share the file); 0 is 5s.
	BusyTimeout time.Duration
}

// OpenSQLite opens (creating) a SQLite file for s, in WAL mode so that
// readers and the writer do not block each other, and migrates it.
func OpenSQLite(ctx context.Context, o SQLiteOptions, s Schema) (*DB, error) {
	if o.Path == "" {
		return nil, fmt.Errorf("open %s: the SQLite path is empty", s.Name)
	}
	busy := o.BusyTimeout
	if busy <= 0 {
		busy = 5 * time.Second
	}
	q := url.Values{}
	q.Set("_busy_timeout", strconv.FormatInt(busy.Milliseconds(), 10))
	q.Set("_journal_mode", "WAL")
	// NORMAL is durable across a process crash in WAL mode; only a power
	// loss may take the last transactions.
	q.Set("_synchronous", "NORMAL")
	// Every transaction takes the write lock when it begins, so two
	// migrating processes queue instead of failing on an upgrade.
	q.Set("_txlock", "immediate")
	db, err := open(SQLite, "file:"+o.Path+"?"+q.Encode(), o.Path, s)
	if err != nil {
		return nil, err
	}
	// A local file: what fails here is the path, which waiting will not
	// mend; but a new file's first openers (the API and the worker
	// starting together) race to switch it to WAL, and SQLite answers
	// the loser SQLITE_BUSY at once rather than after the busy timeout:
	// that is retried for as long.
	err = backoff.Policy{First: 10 * time.Millisecond, Max: 200 * time.Millisecond}.Retry(ctx, busy, func() error {
		err := db.Migrate(ctx)
		if err != nil && !sqliteBusy(err) {
			return backoff.Stop(err)
		}
		return err
	})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return db, nil
}

// sqliteBusy reports SQLite's SQLITE_BUSY (5): another connection holds
// the lock.
func sqliteBusy(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && e.Code()&0xff == 5
}

// OpenPostgres opens a PostgreSQL database for s (dsn as libpq takes it:
// postgres://user:pass@host:5432/db?sslmode=...). It does not connect:
// Migrate does, and its records' first use should if Migrate did not
// succeed, so that a database out of reach when a process starts delays
// records rather than the process.
func OpenPostgres(dsn string, s Schema) (*DB, error) {
	if _, err := pgx.ParseConfig(dsn); err != nil {
		// pgx's error quotes no password.
		return nil, fmt.Errorf("open %s (postgres): %w", s.Name, err)
	}
	return open(Postgres, dsn, RedactDSN(dsn), s)
}

func open(d Dialect, dsn, where string, s Schema) (*DB, error) {
	db, err := sql.Open(d.driver, dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s (%s %s): %w", s.Name, d.Name, where, err)
	}
	db.SetMaxOpenConns(d.maxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	return &DB{SQL: db, Dialect: d, Where: where, schema: s}, nil
}

// Migrate brings the schema up to date, once per DB.
func (db *DB) Migrate(ctx context.Context) error {
	if db.migrated.Load() {
		return nil
	}
	db.migrating.Lock()
	defer db.migrating.Unlock()
	if db.migrated.Load() {
		return nil
	}
	if err := migrate(ctx, db.SQL, db.Dialect, db.schema); err != nil {
		return fmt.Errorf("migrate %s (%s %s): %w", db.schema.Name, db.Dialect.Name, db.Where, err)
	}
	db.migrated.Store(true)
	return nil
}

// Close closes the database.
func (db *DB) Close() error { return db.SQL.Close() }

// RedactDSN names a PostgreSQL DSN without its password, for errors.
func RedactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		return "(dsn)"
	}
	return u.Redacted()
}
