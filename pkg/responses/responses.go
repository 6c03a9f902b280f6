// Package responses keeps the Responses API's stored responses: what a
// response was asked (its parameters and input items) and what it
// answered, per tenant, in SQLite or PostgreSQL (pkg/sqldb). The API
// writes the asking when it admits a stored response; the chat workflow
// writes the answer when the request has ended. Either may come first:
// both are upserts of their own columns.
package responses

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/pkg/sqldb"
)

//go:embed migrations/*.sql
var migrations embed.FS

var schema = sqldb.Schema{Name: "response store", Table: "responses_schema_migrations", Migrations: migrations, Dir: "migrations",
	// Arbitrary, the store's own.
	LockKey: 7106543212}

// ErrNotFound: no such response of the tenant (another tenant's is not
// found either).
var ErrNotFound = errors.New("no such response")

// ErrChainTooLong: previous_response_id reaches back through more
// responses than the store follows.
var ErrChainTooLong = errors.New("the chain of previous responses is too long")

// Record is one stored response.
type Record struct {
	ID, Tenant, User string
	// Status is the Response's, queued until it ends.
	Status string
	// Params is the Response as asked, before any output; Input its input
	// items as a JSON array; Response the Response as it ended (empty
	// until then).
	Params, Input, Response json.RawMessage
	// PreviousID is the response it continues ("" none).
	PreviousID  string
	CreatedAt   time.Time
	CompletedAt time.Time
}

// Ended reports whether the response has its answer.
func (r Record) Ended() bool { return len(r.Response) > 0 }

// Store is the stored responses in a SQL database.
type Store struct {
	db *sqldb.DB
}

// OpenSQLite opens (creating) the store in a SQLite file, and migrates it.
func OpenSQLite(ctx context.Context, o sqldb.SQLiteOptions) (*Store, error) {
	db, err := sqldb.OpenSQLite(ctx, o, schema)
	if err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

// OpenPostgres opens the store in PostgreSQL without connecting: the
// first use migrates it.
func OpenPostgres(dsn string) (*Store, error) {
	db, err := sqldb.OpenPostgres(dsn, schema)
	if err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func (s *Store) exec(ctx context.Context, what, q string, args ...any) (sql.Result, error) {
	if err := s.db.Migrate(ctx); err != nil {
		return nil, err
	}
	res, err := s.db.SQL.ExecContext(ctx, s.db.Dialect.Rebind(q), args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return res, nil
}

// Create stores what r asked (its parameters, input and the response it
// continues), as queued unless its answer was stored first.
func (s *Store) Create(ctx context.Context, r Record) error {
	_, err := s.exec(ctx, "store response "+r.ID, `INSERT INTO responses
		(id, tenant, user_name, status, params, input, previous_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET user_name = excluded.user_name, params = excluded.params, input = excluded.input,
			previous_id = excluded.previous_id, created_at = excluded.created_at
		WHERE responses.status <> 'deleted'`,
		r.ID, r.Tenant, r.User, r.Status, string(r.Params), string(r.Input), r.PreviousID, r.CreatedAt.UnixMilli())
	return err
}

// Finish stores the answer of response id of tenant, which ended with
// status at at. Again for the same response, it writes the same; for a
// deleted one, nothing.
func (s *Store) Finish(ctx context.Context, id, tenant, status string, response json.RawMessage, at time.Time) error {
	_, err := s.exec(ctx, "store the answer of response "+id, `INSERT INTO responses
		(id, tenant, status, response, created_at, completed_at) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET status = excluded.status, response = excluded.response, completed_at = excluded.completed_at
		WHERE responses.status <> 'deleted'`,
		id, tenant, status, string(response), at.UnixMilli(), at.UnixMilli())
	return err
}

// Get is tenant's response id.
func (s *Store) Get(ctx context.Context, tenant, id string) (Record, error) {
	if err := s.db.Migrate(ctx); err != nil {
		return Record{}, err
	}
	var r Record
	var params, input, response string
	var created, completed int64
	err := s.db.SQL.QueryRowContext(ctx, s.db.Dialect.Rebind(`SELECT id, tenant, user_name, status, params, input, response,
		previous_id, created_at, completed_at FROM responses WHERE id = ? AND tenant = ? AND status <> 'deleted'`), id, tenant).
		Scan(&r.ID, &r.Tenant, &r.User, &r.Status, &params, &input, &response, &r.PreviousID, &created, &completed)
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, fmt.Errorf("read response %s: %w", id, err)
	}
	r.Params, r.Input, r.Response = rawOrNil(params), rawOrNil(input), rawOrNil(response)
	r.CreatedAt = time.UnixMilli(created)
	if completed > 0 {
		r.CompletedAt = time.UnixMilli(completed)
	}
	return r, nil
}

func rawOrNil(s string) json.RawMessage {
	if s == "" {
		return nil
	}
	return json.RawMessage(s)
}

// Delete deletes tenant's response id, reporting whether there was one.
// Its row stays as a tombstone without content, of status 'deleted',
// which every read and write here passes over.
func (s *Store) Delete(ctx context.Context, tenant, id string) (bool, error) {
	res, err := s.exec(ctx, "delete response "+id, `UPDATE responses SET status = 'deleted', params = '', input = '', response = ''
		WHERE id = ? AND tenant = ? AND status <> 'deleted'`, id, tenant)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("delete response %s: %w", id, err)
	}
	return n == 1, nil
}

// Chain is tenant's response id and the responses it continues, oldest
// first, at most max of them (else ErrChainTooLong). A response of the
// chain that is gone (deleted) ends it there, as if it began a
// conversation; id itself must be there (else ErrNotFound).
func (s *Store) Chain(ctx context.Context, tenant, id string, max int) ([]Record, error) {
	var out []Record
	for next := id; next != ""; {
		if len(out) == max {
			return nil, ErrChainTooLong
		}
		r, err := s.Get(ctx, tenant, next)
		if errors.Is(err, ErrNotFound) && len(out) > 0 {
			break
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
		next = r.PreviousID
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}
