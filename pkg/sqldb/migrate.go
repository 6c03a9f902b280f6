package sqldb

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Migrations are versioned SQL files applied in order, each once, in one
// transaction with its record in the schema's table. A maintained
// migration library (goose) was weighed and left: its module requires
// every driver it supports and would raise grpc, x/net and others across
// the whole module, for schemas of a few tables and indexes, written in
// SQL both backends take as it is.

// Migration is one file: NNNN_name.sql.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Load reads s's migrations, in version order.
func (s Schema) Load() ([]Migration, error) {
	files, err := fs.Glob(s.Migrations, path.Join(s.Dir, "*.sql"))
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, f := range files {
		name := path.Base(f)
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_what.sql", name)
		}
		body, err := fs.ReadFile(s.Migrations, f)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migrations %s and %s share a version", out[i-1].Name, out[i].Name)
		}
	}
	return out, nil
}

// migrate brings s up to date. Processes starting together (an API and a
// worker) take turns: PostgreSQL's advisory lock, SQLite's write lock
// from BEGIN IMMEDIATE (the DSN's _txlock), and the second finds the work
// done.
func migrate(ctx context.Context, db *sql.DB, d Dialect, s Schema) error {
	all, err := s.Load()
	if err != nil {
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin migration: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if d.numbered {
		if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", s.LockKey); err != nil {
			return fmt.Errorf("lock for migration: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+s.Table+` (
		version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)`); err != nil {
		return fmt.Errorf("create %s: %w", s.Table, err)
	}
	applied, err := appliedVersions(ctx, tx, s.Table)
	if err != nil {
		return err
	}
	for _, m := range all {
		if applied[m.Version] {
			continue
		}
		if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
			return fmt.Errorf("apply migration %s: %w", m.Name, err)
		}
		if _, err := tx.ExecContext(ctx, d.Rebind(`INSERT INTO `+s.Table+` (version, name, applied_at) VALUES (?, ?, ?)`),
			m.Version, m.Name, time.Now().UnixMilli()); err != nil {
			return fmt.Errorf("record migration %s: %w", m.Name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit migrations: %w", err)
	}
	return nil
}

func appliedVersions(ctx context.Context, tx *sql.Tx, table string) (map[int]bool, error) {
	applied := map[int]bool{}
	rows, err := tx.QueryContext(ctx, `SELECT version FROM `+table)
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("read applied migrations: %w", err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	return applied, nil
}
