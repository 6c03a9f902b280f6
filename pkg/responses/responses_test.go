package responses

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/sqldb"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// pg is the package's one PostgreSQL cluster, stopped by TestMain.
var pg testenv.SharedPostgres

func TestMain(m *testing.M) { os.Exit(pg.Run(m)) }

// backends runs f against a fresh store of each backend (PostgreSQL is
// skipped, saying so, only where it is not installed).
func backends(t *testing.T, f func(t *testing.T, s *Store)) {
	t.Run("sqlite", func(t *testing.T) {
		s, err := OpenSQLite(context.Background(), sqldb.SQLiteOptions{Path: filepath.Join(t.TempDir(), "r.db")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		f(t, s)
	})
	t.Run("postgres", func(t *testing.T) {
		s, err := OpenPostgres(pg.NewDatabase(t, "responses"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		f(t, s)
	})
}

var t0 = time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)

func asked(id, tenant, previous string) Record {
	return Record{ID: id, Tenant: tenant, User: "ann", Status: "queued", Params: []byte(`{"model":"m"}`),
		Input: []byte(`[{"role":"user","content":"q ` + id + `"}]`), PreviousID: previous, CreatedAt: t0}
}

// The asking and the answer are stored in either order, each once, and
// a tenant sees only its own.
func TestCreateAndFinishInEitherOrder(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		if err := s.Create(ctx, asked("resp_a", "acme", "")); err != nil {
			t.Fatal(err)
		}
		if r, err := s.Get(ctx, "acme", "resp_a"); err != nil || r.Ended() || r.Status != "queued" || string(r.Params) != `{"model":"m"}` {
			t.Fatalf("before its answer: %+v, %v", r, err)
		}
		for range 2 {
			if err := s.Finish(ctx, "resp_a", "acme", "completed", []byte(`{"status":"completed"}`), t0.Add(time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		// The answer first, then the asking (a fast answer's workflow
		// can end before the API writes what was asked).
		if err := s.Finish(ctx, "resp_b", "acme", "incomplete", []byte(`{"status":"incomplete"}`), t0.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := s.Create(ctx, asked("resp_b", "acme", "resp_a")); err != nil {
			t.Fatal(err)
		}
		for _, want := range []struct{ id, status string }{{"resp_a", "completed"}, {"resp_b", "incomplete"}} {
			r, err := s.Get(ctx, "acme", want.id)
			if err != nil || !r.Ended() || r.Status != want.status || len(r.Input) == 0 || r.User != "ann" || !r.CreatedAt.Equal(t0) {
				t.Fatalf("%s: %+v, %v", want.id, r, err)
			}
		}
		if _, err := s.Get(ctx, "other", "resp_a"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("another tenant reads resp_a: %v", err)
		}
		if ok, err := s.Delete(ctx, "other", "resp_a"); ok || err != nil {
			t.Fatalf("another tenant deletes resp_a: %v, %v", ok, err)
		}
	})
}

// A deleted response is gone for good: an answer stored after the delete
// (its workflow still ran) does not bring it back.
func TestDeletedStaysDeleted(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		if err := s.Create(ctx, asked("resp_a", "acme", "")); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Delete(ctx, "acme", "resp_a"); !ok || err != nil {
			t.Fatalf("delete: %v, %v", ok, err)
		}
		if ok, _ := s.Delete(ctx, "acme", "resp_a"); ok {
			t.Fatal("deleted twice")
		}
		if err := s.Finish(ctx, "resp_a", "acme", "completed", []byte(`{}`), t0); err != nil {
			t.Fatal(err)
		}
		if err := s.Create(ctx, asked("resp_a", "acme", "")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, "acme", "resp_a"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a deleted response came back: %v", err)
		}
	})
}

// A chain is read oldest first, bounded, and a deleted ancestor ends it.
func TestChain(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		prev := ""
		for _, id := range []string{"r1", "r2", "r3", "r4"} {
			if err := s.Create(ctx, asked(id, "acme", prev)); err != nil {
				t.Fatal(err)
			}
			prev = id
		}
		ids := func(rs []Record) (out []string) {
			for _, r := range rs {
				out = append(out, r.ID)
			}
			return out
		}
		if c, err := s.Chain(ctx, "acme", "r4", 10); err != nil || fmt.Sprint(ids(c)) != "[r1 r2 r3 r4]" {
			t.Fatalf("chain %v, %v", ids(c), err)
		}
		if _, err := s.Chain(ctx, "acme", "r4", 3); !errors.Is(err, ErrChainTooLong) {
			t.Fatalf("a chain of 4 within 3: %v", err)
		}
		if _, err := s.Chain(ctx, "other", "r4", 10); !errors.Is(err, ErrNotFound) {
			t.Fatalf("another tenant's chain: %v", err)
		}
		if _, err := s.Delete(ctx, "acme", "r2"); err != nil {
			t.Fatal(err)
		}
		if c, err := s.Chain(ctx, "acme", "r4", 10); err != nil || fmt.Sprint(ids(c)) != "[r3 r4]" {
			t.Fatalf("chain past a deleted response %v, %v", ids(c), err)
		}
	})
}
