package usage

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"slices"
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

// dialect is what differs between the backends: the driver, how
// parameters are written, and the lock migrations take.
type dialect struct {
	name   string
	driver string
	// numbered: parameters are $1, $2 (PostgreSQL), not ?.
	numbered bool
	lock     string
	maxConns int
}

var (
	sqliteDialect = dialect{name: "sqlite", driver: "sqlite", maxConns: 4}
	// The advisory lock's key is arbitrary, the ledger's own.
	postgresDialect = dialect{name: "postgres", driver: "pgx", numbered: true, lock: "SELECT pg_advisory_xact_lock(7106543211)", maxConns: 8}
)

// rebind writes q's ? parameters as the dialect wants them. The ledger's
// SQL has no ? anywhere else.
func (d dialect) rebind(q string) string {
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

// SQLStore is the ledger in a SQL database.
type SQLStore struct {
	db      *sql.DB
	dialect dialect
	// where names the database in errors (a path, or a DSN without its
	// password).
	where  string
	insert string
	// migrated is set once the schema is known current; until then every
	// call migrates first (a PostgreSQL ledger may be out of reach when
	// the process starts).
	migrated  atomic.Bool
	migrating sync.Mutex
}

// SQLiteOptions open the ledger in a SQLite file.
type SQLiteOptions struct {
	Path string
	// BusyTimeout is how long a write waits for another process's (the
	// API's and the worker's share the file); 0 is 5s.
	BusyTimeout time.Duration
}

// OpenSQLite opens (creating) the ledger in a SQLite file, in WAL mode so
// that readers (GET /v1/usage) and the writer (the worker) do not block
// each other, and migrates it.
func OpenSQLite(ctx context.Context, o SQLiteOptions) (*SQLStore, error) {
	if o.Path == "" {
		return nil, fmt.Errorf("open usage ledger: the SQLite path is empty")
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
	dsn := "file:" + o.Path + "?" + q.Encode()
	s, err := open(sqliteDialect, dsn, o.Path)
	if err != nil {
		return nil, err
	}
	// A local file: what fails here is the path, which waiting will not
	// mend; but a new file's first openers (the API and the worker
	// starting together) race to switch it to WAL, and SQLite answers
	// the loser SQLITE_BUSY at once rather than after the busy timeout:
	// that is retried for as long.
	err = backoff.Policy{First: 10 * time.Millisecond, Max: 200 * time.Millisecond}.Retry(ctx, busy, func() error {
		err := s.Migrate(ctx)
		if err != nil && !sqliteBusy(err) {
			return backoff.Stop(err)
		}
		return err
	})
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// sqliteBusy reports SQLite's SQLITE_BUSY (5): another connection holds
// the lock.
func sqliteBusy(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && e.Code()&0xff == 5
}

// OpenPostgres opens the ledger in PostgreSQL (a database of its own,
// dsn as libpq takes it: postgres://user:pass@host:5432/db?sslmode=...).
// It does not connect: Migrate does, and so does the first Record or
// Query if Migrate did not succeed, so that a database out of reach when
// a process starts delays records rather than the process.
func OpenPostgres(dsn string) (*SQLStore, error) {
	if _, err := pgx.ParseConfig(dsn); err != nil {
		// pgx's error quotes no password.
		return nil, fmt.Errorf("open usage ledger (postgres): %w", err)
	}
	return open(postgresDialect, dsn, redactDSN(dsn))
}

func open(d dialect, dsn, where string) (*SQLStore, error) {
	db, err := sql.Open(d.driver, dsn)
	if err != nil {
		return nil, fmt.Errorf("open usage ledger (%s %s): %w", d.name, where, err)
	}
	// One writer at a time is all SQLite has: more connections would only
	// queue on the busy timeout. A PostgreSQL ledger is shared by every
	// process of a deployment; each keeps a few connections.
	db.SetMaxOpenConns(d.maxConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	return &SQLStore{db: db, dialect: d, where: where, insert: d.rebind(`INSERT INTO usage_records
		(request_id, tenant, user_name, key_id, model, pool, route, prompt_tokens, completion_tokens, cached_tokens, outcome, reason, finished_at, day, service_tier)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (request_id) DO NOTHING`)}, nil
}

// Migrate brings the ledger's schema up to date, once per store.
func (s *SQLStore) Migrate(ctx context.Context) error {
	if s.migrated.Load() {
		return nil
	}
	s.migrating.Lock()
	defer s.migrating.Unlock()
	if s.migrated.Load() {
		return nil
	}
	if err := migrate(ctx, s.db, s.dialect); err != nil {
		return fmt.Errorf("migrate usage ledger (%s %s): %w", s.dialect.name, s.where, err)
	}
	s.migrated.Store(true)
	return nil
}

// redactDSN names a PostgreSQL DSN without its password, for errors.
func redactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		return "(dsn)"
	}
	return u.Redacted()
}

// Record implements Store.
func (s *SQLStore) Record(ctx context.Context, e Entry) (bool, error) {
	if err := e.Validate(); err != nil {
		return false, err
	}
	if err := s.Migrate(ctx); err != nil {
		return false, err
	}
	res, err := s.db.ExecContext(ctx, s.insert, e.RequestID, e.Tenant, e.User, e.KeyID, e.Model, e.Pool, e.Route,
		e.PromptTokens, e.CompletionTokens, e.CachedTokens, e.Outcome, e.Reason, e.FinishedAt.UnixMilli(), Day(e.FinishedAt), e.ServiceTier)
	if err != nil {
		return false, fmt.Errorf("record usage of %s: %w", e.RequestID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("record usage of %s: %w", e.RequestID, err)
	}
	return n == 1, nil
}

// Query implements Store.
func (s *SQLStore) Query(ctx context.Context, q Query) ([]Row, error) {
	col, ok := column[q.GroupBy]
	if !ok {
		return nil, fmt.Errorf("query usage: unknown grouping %q", q.GroupBy)
	}
	if err := s.Migrate(ctx); err != nil {
		return nil, err
	}
	keys := col
	if q.splitsTenants() {
		keys = "tenant, " + col
	}
	where := "day >= ? AND day < ?"
	args := []any{Day(q.From), Day(q.To)}
	if q.Tenant != "" {
		where += " AND tenant = ?"
		args = append(args, q.Tenant)
	}
	// Sums are cast back to BIGINT: PostgreSQL sums BIGINTs as NUMERIC.
	stmt := s.dialect.rebind(`SELECT ` + keys + `, COUNT(*),
		CAST(SUM(CASE WHEN outcome = 'done' THEN 1 ELSE 0 END) AS BIGINT),
		CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT), CAST(SUM(cached_tokens) AS BIGINT)
		FROM usage_records WHERE ` + where + ` GROUP BY ` + keys + ` ORDER BY ` + keys)
	rows, err := s.db.QueryContext(ctx, stmt, args...)
	if err != nil {
		return nil, fmt.Errorf("query usage by %s: %w", q.GroupBy, err)
	}
	defer rows.Close()
	out := []Row{}
	for rows.Next() {
		var r Row
		dest := []any{&r.Group, &r.Requests, &r.Answered, &r.PromptTokens, &r.CompletionTokens, &r.CachedTokens}
		if q.splitsTenants() {
			dest = append([]any{&r.Tenant}, dest...)
		}
		if q.GroupBy == GroupPool {
			dest = slices.Insert(dest, 1, any(&r.Model))
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("read usage by %s: %w", q.GroupBy, err)
		}
		if q.GroupBy == GroupTenant {
			r.Tenant = r.Group
		}
		r.TotalTokens = r.PromptTokens + r.CompletionTokens
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read usage by %s: %w", q.GroupBy, err)
	}
	return out, nil
}

// Close implements Store.
func (s *SQLStore) Close() error { return s.db.Close() }
