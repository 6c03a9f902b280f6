package usage

import (
	"context"
	"embed"
	"fmt"
	"slices"

	"github.com/sluice-dev/sluice/pkg/sqldb"
)

// schema is the ledger's tables, as migrations/*.sql build them.
var schema = sqldb.Schema{Name: "usage ledger", Table: "usage_schema_migrations", Migrations: migrations, Dir: "migrations",
	// Arbitrary, the ledger's own.
	LockKey: 7106543211}

//go:embed migrations/*.sql
var migrations embed.FS

// SQLStore is the ledger in a SQL database.
type SQLStore struct {
	db     *sqldb.DB
	insert string
}

// SQLiteOptions open the ledger in a SQLite file.
type SQLiteOptions = sqldb.SQLiteOptions

// OpenSQLite opens (creating) the ledger in a SQLite file, in WAL mode so
// that readers (GET /v1/usage) and the writer (the worker) do not block
// each other, and migrates it.
func OpenSQLite(ctx context.Context, o SQLiteOptions) (*SQLStore, error) {
	db, err := sqldb.OpenSQLite(ctx, o, schema)
	if err != nil {
		return nil, err
	}
	return newStore(db), nil
}

// OpenPostgres opens the ledger in PostgreSQL (a database of its own,
// dsn as libpq takes it: postgres://user:pass@host:5432/db?sslmode=...).
// It does not connect: Migrate does, and so does the first Record or
// Query if Migrate did not succeed, so that a database out of reach when
// a process starts delays records rather than the process.
func OpenPostgres(dsn string) (*SQLStore, error) {
	db, err := sqldb.OpenPostgres(dsn, schema)
	if err != nil {
		return nil, err
	}
	return newStore(db), nil
}

func newStore(db *sqldb.DB) *SQLStore {
	return &SQLStore{db: db, insert: db.Dialect.Rebind(`INSERT INTO usage_records
		(request_id, tenant, user_name, key_id, model, pool, route, prompt_tokens, completion_tokens, cached_tokens, outcome, reason, finished_at, day, service_tier)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (request_id) DO NOTHING`)}
}

// Migrate brings the ledger's schema up to date, once per store.
func (s *SQLStore) Migrate(ctx context.Context) error { return s.db.Migrate(ctx) }

// Record implements Store.
func (s *SQLStore) Record(ctx context.Context, e Entry) (bool, error) {
	if err := e.Validate(); err != nil {
		return false, err
	}
	if err := s.Migrate(ctx); err != nil {
		return false, err
	}
	res, err := s.db.SQL.ExecContext(ctx, s.insert, e.RequestID, e.Tenant, e.User, e.KeyID, e.Model, e.Pool, e.Route,
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
	stmt := s.db.Dialect.Rebind(`SELECT ` + keys + `, COUNT(*),
		CAST(SUM(CASE WHEN outcome = 'done' THEN 1 ELSE 0 END) AS BIGINT),
		CAST(SUM(prompt_tokens) AS BIGINT), CAST(SUM(completion_tokens) AS BIGINT), CAST(SUM(cached_tokens) AS BIGINT)
		FROM usage_records WHERE ` + where + ` GROUP BY ` + keys + ` ORDER BY ` + keys)
	rows, err := s.db.SQL.QueryContext(ctx, stmt, args...)
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
