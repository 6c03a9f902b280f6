// Package files keeps uploaded files (the OpenAI Files API): the JSONL
// inputs of batches and the batches' output files, per tenant, in SQLite
// or PostgreSQL (pkg/sqldb). A file is stored as whole lines, in chunks
// of about a MiB, while it is read: an upload of 200 MB is never held in
// memory, and nothing of it is kept unless it is committed whole.
package files

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-dev/sluice/pkg/sqldb"
)

//go:embed migrations/*.sql
var migrations embed.FS

var schema = sqldb.Schema{Name: "file store", Table: "files_schema_migrations", Migrations: migrations, Dir: "migrations",
	// Arbitrary, the store's own.
	LockKey: 7106543213}

// ErrNotFound: no such file of the tenant (another tenant's is not found
// either).
var ErrNotFound = errors.New("no such file")

// File is one stored file's record.
type File struct {
	ID, Tenant, Purpose, Filename string
	Bytes                         int64
	Lines                         int
	// Endpoint is the one url a batch input's lines name ("" for other
	// files).
	Endpoint  string
	CreatedAt time.Time
	// ExpiresAt is when it is deleted (zero: kept until deleted).
	ExpiresAt time.Time
}

// Store is the stored files in a SQL database.
type Store struct {
	db *sqldb.DB
	// chunkBytes is how many bytes of whole lines a chunk gathers before
	// it is written.
	chunkBytes int
}

// defaultChunkBytes: a chunk is one row; a MiB keeps a 200 MB file at 200
// rows, and a reader's memory at a chunk.
const defaultChunkBytes = 1 << 20

// OpenSQLite opens (creating) the store in a SQLite file, and migrates it.
func OpenSQLite(ctx context.Context, o sqldb.SQLiteOptions) (*Store, error) {
	db, err := sqldb.OpenSQLite(ctx, o, schema)
	if err != nil {
		return nil, err
	}
	return &Store{db: db, chunkBytes: defaultChunkBytes}, nil
}

// OpenPostgres opens the store in PostgreSQL without connecting: the
// first use migrates it.
func OpenPostgres(dsn string) (*Store, error) {
	db, err := sqldb.OpenPostgres(dsn, schema)
	if err != nil {
		return nil, err
	}
	return &Store{db: db, chunkBytes: defaultChunkBytes}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Create begins storing file id of tenant, named filename: its lines go
// in with Writer.Line, and it is stored once Writer.Commit returns;
// Writer.Abort (or a failed Commit) leaves nothing of it. A Writer holds
// one transaction: the caller must end it with Commit or Abort.
func (s *Store) Create(ctx context.Context, id, tenant, filename string) (*Writer, error) {
	f := File{ID: id, Tenant: tenant, Filename: filename}
	if err := s.db.Migrate(ctx); err != nil {
		return nil, err
	}
	tx, err := s.db.SQL.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("store file %s: %w", f.ID, err)
	}
	return &Writer{s: s, tx: tx, ctx: ctx, f: f, next: 1}, nil
}

// Writer stores one file's lines as they are read.
type Writer struct {
	s   *Store
	tx  *sql.Tx
	ctx context.Context
	f   File
	// buf is the chunk being gathered, whose first line is first; next
	// is the number of the next line.
	buf   []byte
	first int
	next  int
	seq   int
	done  bool
}

// Line adds the next line, as read (its end of line included).
func (w *Writer) Line(line []byte) error {
	if len(w.buf) == 0 {
		w.first = w.next
	}
	w.buf = append(w.buf, line...)
	w.next++
	w.f.Lines++
	w.f.Bytes += int64(len(line))
	if len(w.buf) >= w.s.chunkBytes {
		return w.flush()
	}
	return nil
}

// Bytes is how many bytes the file holds so far.
func (w *Writer) Bytes() int64 { return w.f.Bytes }

func (w *Writer) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	_, err := w.tx.ExecContext(w.ctx, w.s.db.Dialect.Rebind(`INSERT INTO file_chunks (file_id, seq, first_line, data) VALUES (?, ?, ?, ?)`),
		w.f.ID, w.seq, w.first, string(w.buf))
	if err != nil {
		return fmt.Errorf("store file %s, chunk %d: %w", w.f.ID, w.seq, err)
	}
	w.seq++
	w.buf = w.buf[:0]
	return nil
}

// Meta is what is known of a file once it was read: its purpose, the
// one url of a batch input's lines, when it was created and when it
// expires (zero: never).
type Meta struct {
	Purpose, Endpoint    string
	CreatedAt, ExpiresAt time.Time
}

// Commit stores the file, described by m, and returns its record.
func (w *Writer) Commit(m Meta) (File, error) {
	if w.done {
		return File{}, fmt.Errorf("store file %s: already ended", w.f.ID)
	}
	w.done = true
	w.f.Purpose, w.f.Endpoint, w.f.CreatedAt, w.f.ExpiresAt = m.Purpose, m.Endpoint, m.CreatedAt, m.ExpiresAt
	err := w.flush()
	if err == nil {
		f := w.f
		_, err = w.tx.ExecContext(w.ctx, w.s.db.Dialect.Rebind(`INSERT INTO files
			(id, tenant, purpose, filename, bytes, lines, endpoint, status, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'processed', ?, ?)`),
			f.ID, f.Tenant, f.Purpose, f.Filename, f.Bytes, f.Lines, f.Endpoint, f.CreatedAt.UnixMilli(), millisOrZero(f.ExpiresAt))
		if err != nil {
			err = fmt.Errorf("store file %s: %w", f.ID, err)
		}
	}
	if err == nil {
		if err = w.tx.Commit(); err != nil {
			err = fmt.Errorf("store file %s: %w", w.f.ID, err)
		}
	}
	if err != nil {
		_ = w.tx.Rollback()
		return File{}, err
	}
	return w.f, nil
}

// Abort drops what was written: nothing of the file is stored.
func (w *Writer) Abort() {
	if !w.done {
		w.done = true
		_ = w.tx.Rollback()
	}
}

func millisOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func timeOrZero(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// live is the condition on a file that exists for its tenant at now: not
// deleted, not expired.
const live = `status <> 'deleted' AND (expires_at = 0 OR expires_at > ?)`

const fileColumns = `id, tenant, purpose, filename, bytes, lines, endpoint, created_at, expires_at`

func scanFile(row interface{ Scan(...any) error }) (File, error) {
	var f File
	var created, expires int64
	err := row.Scan(&f.ID, &f.Tenant, &f.Purpose, &f.Filename, &f.Bytes, &f.Lines, &f.Endpoint, &created, &expires)
	f.CreatedAt, f.ExpiresAt = time.UnixMilli(created), timeOrZero(expires)
	return f, err
}

// Get is tenant's file id.
func (s *Store) Get(ctx context.Context, tenant, id string) (File, error) {
	if err := s.db.Migrate(ctx); err != nil {
		return File{}, err
	}
	f, err := scanFile(s.db.SQL.QueryRowContext(ctx, s.db.Dialect.Rebind(`SELECT `+fileColumns+` FROM files
		WHERE id = ? AND tenant = ? AND `+live), id, tenant, time.Now().UnixMilli()))
	if errors.Is(err, sql.ErrNoRows) {
		return File{}, ErrNotFound
	}
	if err != nil {
		return File{}, fmt.Errorf("read file %s: %w", id, err)
	}
	return f, nil
}

// Page asks for a page of a tenant's files, newest first unless Asc,
// after the file After ("" from the start), of Purpose if set.
type Page struct {
	Purpose, After string
	Limit          int
	Asc            bool
}

// List is a page of tenant's files, and whether more follow.
func (s *Store) List(ctx context.Context, tenant string, p Page) ([]File, bool, error) {
	if err := s.db.Migrate(ctx); err != nil {
		return nil, false, err
	}
	q := `SELECT ` + fileColumns + ` FROM files WHERE tenant = ? AND ` + live
	args := []any{tenant, time.Now().UnixMilli()}
	if p.Purpose != "" {
		q += ` AND purpose = ?`
		args = append(args, p.Purpose)
	}
	cmp, order := "<", "DESC"
	if p.Asc {
		cmp, order = ">", "ASC"
	}
	if p.After != "" {
		// Ids are ULIDs: their order is their creation's.
		q += ` AND id ` + cmp + ` ?`
		args = append(args, p.After)
	}
	q += ` ORDER BY id ` + order + ` LIMIT ?`
	args = append(args, p.Limit+1)
	rows, err := s.db.SQL.QueryContext(ctx, s.db.Dialect.Rebind(q), args...)
	if err != nil {
		return nil, false, fmt.Errorf("list files of %s: %w", tenant, err)
	}
	defer rows.Close()
	var out []File
	for rows.Next() {
		f, err := scanFile(rows)
		if err != nil {
			return nil, false, fmt.Errorf("list files of %s: %w", tenant, err)
		}
		out = append(out, f)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("list files of %s: %w", tenant, err)
	}
	more := len(out) > p.Limit
	return out[:min(len(out), p.Limit)], more, nil
}

// Used is how many bytes tenant's files hold, for its quota.
func (s *Store) Used(ctx context.Context, tenant string) (int64, error) {
	if err := s.db.Migrate(ctx); err != nil {
		return 0, err
	}
	var n sql.NullInt64
	err := s.db.SQL.QueryRowContext(ctx, s.db.Dialect.Rebind(`SELECT SUM(bytes) FROM files WHERE tenant = ? AND `+live),
		tenant, time.Now().UnixMilli()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("sum the files of %s: %w", tenant, err)
	}
	return n.Int64, nil
}

// Delete deletes tenant's file id, reporting whether there was one: its
// content goes, its row stays as a tombstone.
func (s *Store) Delete(ctx context.Context, tenant, id string) (bool, error) {
	if _, err := s.Get(ctx, tenant, id); errors.Is(err, ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return s.drop(ctx, id)
}

// DeleteExpired deletes up to limit files whose time ran out (expired
// files are hidden from every read at once; this frees their content),
// and returns how many it deleted.
func (s *Store) DeleteExpired(ctx context.Context, now time.Time, limit int) (int, error) {
	if err := s.db.Migrate(ctx); err != nil {
		return 0, err
	}
	rows, err := s.db.SQL.QueryContext(ctx, s.db.Dialect.Rebind(`SELECT id FROM files
		WHERE status <> 'deleted' AND expires_at > 0 AND expires_at <= ? ORDER BY expires_at LIMIT ?`), now.UnixMilli(), limit)
	if err != nil {
		return 0, fmt.Errorf("find expired files: %w", err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, fmt.Errorf("find expired files: %w", err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("find expired files: %w", err)
	}
	n := 0
	for _, id := range ids {
		ok, err := s.drop(ctx, id)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// drop deletes file id's content and marks its row deleted, in one
// transaction; false when another did it first.
func (s *Store) drop(ctx context.Context, id string) (bool, error) {
	tx, err := s.db.SQL.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("delete file %s: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, s.db.Dialect.Rebind(`UPDATE files SET status = 'deleted' WHERE id = ? AND status <> 'deleted'`), id)
	if err != nil {
		return false, fmt.Errorf("delete file %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, s.db.Dialect.Rebind(`DELETE FROM file_chunks WHERE file_id = ?`), id); err != nil {
		return false, fmt.Errorf("delete the content of file %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("delete file %s: %w", id, err)
	}
	return true, nil
}
