package sqldb

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

func TestRebind(t *testing.T) {
	if got := Postgres.Rebind("a = ? AND b = ?"); got != "a = $1 AND b = $2" {
		t.Fatal(got)
	}
	if got := SQLite.Rebind("a = ?"); got != "a = ?" {
		t.Fatal(got)
	}
}

func schemaOf(files map[string]string) Schema {
	fsys := fstest.MapFS{}
	for name, body := range files {
		fsys["m/"+name] = &fstest.MapFile{Data: []byte(body)}
	}
	return Schema{Name: "test records", Table: "test_schema_migrations", Migrations: fsys, Dir: "m", LockKey: 1}
}

// Migrations apply in version order, each once, and a later one applies
// to a database the earlier ones built; two kinds of record in one file
// keep their own tables of applied migrations.
func TestMigrationsApplyInOrderOnce(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "db")
	first := schemaOf(map[string]string{"0002_b.sql": "ALTER TABLE a ADD COLUMN y INTEGER", "0001_a.sql": "CREATE TABLE a (x INTEGER)"})
	db, err := OpenSQLite(ctx, SQLiteOptions{Path: path}, first)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.SQL.Exec("INSERT INTO a (x, y) VALUES (1, 2)"); err != nil {
		t.Fatalf("the second migration did not follow the first: %v", err)
	}
	db.Close()
	later := schemaOf(map[string]string{"0001_a.sql": "CREATE TABLE a (x INTEGER)", "0002_b.sql": "ALTER TABLE a ADD COLUMN y INTEGER",
		"0003_c.sql": "CREATE INDEX a_x ON a (x)"})
	db, err = OpenSQLite(ctx, SQLiteOptions{Path: path}, later)
	if err != nil {
		t.Fatalf("reopened with one migration more: %v", err)
	}
	defer db.Close()
	var n int
	if err := db.SQL.QueryRow("SELECT COUNT(*) FROM test_schema_migrations").Scan(&n); err != nil || n != 3 {
		t.Fatalf("%d migrations recorded (%v), want 3", n, err)
	}
	other := schemaOf(map[string]string{"0001_a.sql": "CREATE TABLE other (z INTEGER)"})
	other.Table = "other_schema_migrations"
	if _, err := OpenSQLite(ctx, SQLiteOptions{Path: path}, other); err != nil {
		t.Fatalf("a second kind of record in the same file: %v", err)
	}
}

func TestBadMigrationNames(t *testing.T) {
	for name, files := range map[string]map[string]string{
		"no number":      {"a.sql": "SELECT 1"},
		"shared version": {"0001_a.sql": "SELECT 1", "01_b.sql": "SELECT 1"},
	} {
		if _, err := schemaOf(files).Load(); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
	_, err := OpenSQLite(context.Background(), SQLiteOptions{Path: filepath.Join(t.TempDir(), "db")},
		schemaOf(map[string]string{"0001_a.sql": "NOT SQL"}))
	if err == nil || !strings.Contains(err.Error(), "migrate test records") || !strings.Contains(err.Error(), "0001_a.sql") {
		t.Fatalf("a migration that fails: %v", err)
	}
}
