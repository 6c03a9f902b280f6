package files

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/sqldb"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// pg is the package's one PostgreSQL cluster, stopped by TestMain.
var pg testenv.SharedPostgres

func TestMain(m *testing.M) { os.Exit(pg.Run(m)) }

// backends runs f against a fresh store of each backend, with chunks of
// chunk bytes (PostgreSQL is skipped, saying so, only where it is not
// installed).
func backends(t *testing.T, chunk int, f func(t *testing.T, s *Store)) {
	t.Run("sqlite", func(t *testing.T) {
		s, err := OpenSQLite(context.Background(), sqldb.SQLiteOptions{Path: filepath.Join(t.TempDir(), "f.db")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		s.chunkBytes = chunk
		f(t, s)
	})
	t.Run("postgres", func(t *testing.T) {
		s, err := OpenPostgres(pg.NewDatabase(t, "files"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		s.chunkBytes = chunk
		f(t, s)
	})
}

var t0 = time.Now().Truncate(time.Millisecond)

// put stores lines as file id of tenant.
func put(t *testing.T, s *Store, id, tenant string, lines []string, m Meta) File {
	t.Helper()
	w, err := s.Create(context.Background(), id, tenant, id+".jsonl")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lines {
		if err := w.Line([]byte(l)); err != nil {
			t.Fatal(err)
		}
	}
	f, err := w.Commit(m)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func content(t *testing.T, s *Store, tenant, id string) string {
	t.Helper()
	r, err := s.Open(context.Background(), tenant, id)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A file comes back byte for byte, over several chunks (each of whole
// lines), the last line without its newline included; it counts its
// bytes and lines, and it is its tenant's alone.
func TestFileReadsBackAsWritten(t *testing.T) {
	backends(t, 64, func(t *testing.T, s *Store) {
		var lines []string
		for i := range 20 {
			lines = append(lines, fmt.Sprintf(`{"custom_id":"r%d","method":"POST","url":"/v1/embeddings","body":{}}`+"\r\n", i))
		}
		lines = append(lines, `{"last":"no newline"}`)
		f := put(t, s, "file-A", "acme", lines, Meta{Purpose: "batch", Endpoint: "/v1/embeddings", CreatedAt: t0})
		want := strings.Join(lines, "")
		if f.Bytes != int64(len(want)) || f.Lines != 21 || f.Endpoint != "/v1/embeddings" {
			t.Fatalf("stored %+v", f)
		}
		if got := content(t, s, "acme", "file-A"); got != want {
			t.Fatalf("read back %d bytes, want %d:\n%q", len(got), len(want), got)
		}
		got, err := s.Get(context.Background(), "acme", "file-A")
		if err != nil || got.Purpose != "batch" || got.Filename != "file-A.jsonl" || !got.CreatedAt.Equal(t0) || !got.ExpiresAt.IsZero() {
			t.Fatalf("get: %+v %v", got, err)
		}
		if _, err := s.Get(context.Background(), "globex", "file-A"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("another tenant reads it: %v", err)
		}
		if _, err := s.Open(context.Background(), "globex", "file-A"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("another tenant opens it: %v", err)
		}
	})
}

// An aborted upload leaves nothing, its chunks included; a deleted file
// is gone, content and all, and no longer counts against the quota.
func TestAbortedAndDeletedFilesLeaveNothing(t *testing.T) {
	backends(t, 8, func(t *testing.T, s *Store) {
		ctx := context.Background()
		w, err := s.Create(ctx, "file-B", "acme", "b.jsonl")
		if err != nil {
			t.Fatal(err)
		}
		for range 10 {
			if err := w.Line([]byte("0123456789\n")); err != nil {
				t.Fatal(err)
			}
		}
		w.Abort()
		if _, err := s.Get(ctx, "acme", "file-B"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("an aborted file is found: %v", err)
		}
		var chunks int
		if err := s.db.SQL.QueryRowContext(ctx, `SELECT COUNT(*) FROM file_chunks`).Scan(&chunks); err != nil || chunks != 0 {
			t.Fatalf("%d chunks left by an aborted upload (%v)", chunks, err)
		}

		put(t, s, "file-C", "acme", []string{"a\n", "b\n"}, Meta{Purpose: "batch", CreatedAt: t0})
		put(t, s, "file-D", "acme", []string{"cc\n"}, Meta{Purpose: "batch", CreatedAt: t0})
		if used, err := s.Used(ctx, "acme"); err != nil || used != 7 {
			t.Fatalf("used %d (%v), want 7", used, err)
		}
		if ok, err := s.Delete(ctx, "globex", "file-C"); ok || err != nil {
			t.Fatalf("another tenant deletes the file: %v %v", ok, err)
		}
		if ok, err := s.Delete(ctx, "acme", "file-C"); !ok || err != nil {
			t.Fatalf("delete: %v %v", ok, err)
		}
		if _, err := s.Open(ctx, "acme", "file-C"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a deleted file opens: %v", err)
		}
		if used, err := s.Used(ctx, "acme"); err != nil || used != 3 {
			t.Fatalf("used %d (%v) after the delete, want 3", used, err)
		}
		if ok, err := s.Delete(ctx, "acme", "file-C"); ok || err != nil {
			t.Fatalf("delete again: %v %v", ok, err)
		}
	})
}

// List pages through a tenant's files by id, newest first or oldest
// first, of one purpose if asked; an expired file is not listed.
func TestListPagesAndExpires(t *testing.T) {
	backends(t, 1024, func(t *testing.T, s *Store) {
		ctx := context.Background()
		for _, id := range []string{"file-1", "file-2", "file-3"} {
			put(t, s, id, "acme", []string{"x\n"}, Meta{Purpose: "batch", CreatedAt: t0})
		}
		put(t, s, "file-4", "acme", []string{"x\n"}, Meta{Purpose: "batch_output", CreatedAt: t0})
		put(t, s, "file-5", "acme", []string{"x\n"}, Meta{Purpose: "batch", CreatedAt: t0, ExpiresAt: time.Now().Add(-time.Second)})
		put(t, s, "file-6", "globex", []string{"x\n"}, Meta{Purpose: "batch", CreatedAt: t0})
		ids := func(fs []File) string {
			var out []string
			for _, f := range fs {
				out = append(out, f.ID)
			}
			return strings.Join(out, " ")
		}
		page, more, err := s.List(ctx, "acme", Page{Purpose: "batch", Limit: 2})
		if err != nil || ids(page) != "file-3 file-2" || !more {
			t.Fatalf("first page %q more %v (%v)", ids(page), more, err)
		}
		page, more, err = s.List(ctx, "acme", Page{Purpose: "batch", Limit: 2, After: "file-2"})
		if err != nil || ids(page) != "file-1" || more {
			t.Fatalf("second page %q more %v (%v)", ids(page), more, err)
		}
		page, _, err = s.List(ctx, "acme", Page{Limit: 10, Asc: true})
		if err != nil || ids(page) != "file-1 file-2 file-3 file-4" {
			t.Fatalf("all, oldest first: %q (%v)", ids(page), err)
		}
		if _, err := s.Get(ctx, "acme", "file-5"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("an expired file is read: %v", err)
		}
	})
}

// The sweep frees expired files' content a batch at a time, and leaves
// live files, and files already deleted, alone.
func TestDeleteExpired(t *testing.T) {
	backends(t, 4, func(t *testing.T, s *Store) {
		ctx := context.Background()
		past := time.Now().Add(-time.Minute)
		for _, id := range []string{"file-x1", "file-x2", "file-x3"} {
			put(t, s, id, "acme", []string{"line one\n", "line two\n"}, Meta{Purpose: "batch", CreatedAt: t0, ExpiresAt: past})
		}
		put(t, s, "file-live", "acme", []string{"kept\n"}, Meta{Purpose: "batch", CreatedAt: t0, ExpiresAt: time.Now().Add(time.Hour)})
		put(t, s, "file-forever", "acme", []string{"kept\n"}, Meta{Purpose: "batch", CreatedAt: t0})
		if n, err := s.DeleteExpired(ctx, time.Now(), 2); n != 2 || err != nil {
			t.Fatalf("first round deleted %d (%v), want 2", n, err)
		}
		if n, err := s.DeleteExpired(ctx, time.Now(), 2); n != 1 || err != nil {
			t.Fatalf("second round deleted %d (%v), want 1", n, err)
		}
		if n, err := s.DeleteExpired(ctx, time.Now(), 2); n != 0 || err != nil {
			t.Fatalf("third round deleted %d (%v), want none", n, err)
		}
		var chunks int
		if err := s.db.SQL.QueryRowContext(ctx, s.db.Dialect.Rebind(`SELECT COUNT(*) FROM file_chunks WHERE file_id IN (?, ?, ?)`),
			"file-x1", "file-x2", "file-x3").Scan(&chunks); err != nil || chunks != 0 {
			t.Fatalf("%d chunks of expired files left (%v)", chunks, err)
		}
		for _, id := range []string{"file-live", "file-forever"} {
			if got := content(t, s, "acme", id); got != "kept\n" {
				t.Fatalf("%s reads %q", id, got)
			}
		}
	})
}
