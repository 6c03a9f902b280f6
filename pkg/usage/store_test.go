package usage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/tests/testenv"
)

var day1 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func entry(id, tenant, user, key, model string, at time.Time, prompt, completion int) Entry {
	return Entry{RequestID: id, Tenant: tenant, User: user, KeyID: key, Model: model, Pool: "short", Route: "short",
		PromptTokens: prompt, CompletionTokens: completion, Outcome: "done", FinishedAt: at}
}

// backends runs f against a fresh ledger of every backend: a SQLite file,
// and a database of a throwaway PostgreSQL cluster (skipped, saying so,
// only where PostgreSQL is not installed).
func backends(t *testing.T, f func(t *testing.T, open opener)) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "usage.db")
		f(t, opener{t: t, open: func() (*SQLStore, error) {
			return OpenSQLite(context.Background(), SQLiteOptions{Path: path})
		}})
	})
	t.Run("postgres", func(t *testing.T) {
		srv := pg.Get(t)
		db := fmt.Sprintf("usage_%d", time.Now().UnixNano())
		if err := srv.CreateDatabase(context.Background(), db); err != nil {
			t.Fatal(err)
		}
		f(t, opener{t: t, open: func() (*SQLStore, error) {
			s, err := OpenPostgres(srv.DSN(db))
			if err != nil {
				return nil, err
			}
			return s, s.Migrate(context.Background())
		}})
	})
}

// opener opens one test's ledger, as many times as it likes; each is
// closed when the test ends.
type opener struct {
	t    *testing.T
	open func() (*SQLStore, error)
}

// try opens it, for goroutines, which must not call Fatal.
func (o opener) try() (*SQLStore, error) {
	s, err := o.open()
	if err == nil {
		o.t.Cleanup(func() { s.Close() })
	}
	return s, err
}

func (o opener) must() *SQLStore {
	o.t.Helper()
	s, err := o.try()
	if err != nil {
		o.t.Fatal(err)
	}
	return s
}

// pg is the package's one PostgreSQL cluster, stopped by TestMain.
var pg testenv.SharedPostgres

func TestMain(m *testing.M) {
	code := m.Run()
	if err := pg.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop postgres:", err)
	}
	os.Exit(code)
}

// A request is recorded once: recording it again, even with other
// numbers (a retry never has them, but the ledger must not care), adds
// nothing and says so.
func TestRecordIsOncePerRequest(t *testing.T) {
	backends(t, func(t *testing.T, open opener) {
		s := open.must()
		ctx := context.Background()
		e := entry("chat-1", "acme", "alice", "k1", "m1", day1, 10, 5)
		if ins, err := s.Record(ctx, e); err != nil || !ins {
			t.Fatalf("first record: inserted %v, %v", ins, err)
		}
		e.CompletionTokens = 500
		if ins, err := s.Record(ctx, e); err != nil || ins {
			t.Fatalf("second record: inserted %v, %v", ins, err)
		}
		rows, err := s.Query(ctx, Query{Tenant: "acme", From: day1, To: day1.AddDate(0, 0, 1), GroupBy: GroupDay})
		if err != nil {
			t.Fatal(err)
		}
		want := []Row{{Group: "2026-12-01", Requests: 1, Answered: 1, PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15}}
		if !reflect.DeepEqual(rows, want) {
			t.Fatalf("rows %+v, want %+v", rows, want)
		}
	})
}

// Concurrent records of one request (two workers racing after a
// crash) insert it once between them.
func TestConcurrentRecordsInsertOnce(t *testing.T) {
	backends(t, func(t *testing.T, open opener) {
		stores := []Store{open.must(), open.must()}
		var wg sync.WaitGroup
		var mu sync.Mutex
		inserted := 0
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ins, err := stores[i%2].Record(context.Background(), entry("chat-race", "acme", "alice", "k1", "m1", day1, 1, 1))
				if err != nil {
					t.Error(err)
				}
				if ins {
					mu.Lock()
					inserted++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if inserted != 1 {
			t.Fatalf("inserted %d times", inserted)
		}
	})
}

func seed(t *testing.T, s Store) {
	t.Helper()
	served := func(class string, e Entry) Entry {
		e.ServiceTier = class
		return e
	}
	for _, e := range []Entry{
		served("priority", entry("chat-a1", "acme", "alice", "ka", "m1", day1, 10, 5)),
		served("flex", entry("chat-a2", "acme", "bob", "kb", "m2", day1.Add(13*time.Hour), 20, 7)), // 23:00, still day 1
		served("flex", entry("chat-a3", "acme", "alice", "ka", "m1", day1.AddDate(0, 0, 1), 1, 1)),
		entry("chat-a4", "acme", "alice", "ka", "m1", day1.AddDate(0, 0, 2), 100, 100), // outside [day1, day1+2)
		entry("chat-b1", "beta", "alice", "kz", "m1", day1, 1000, 1000),
		{RequestID: "chat-a5", Tenant: "acme", User: "alice", KeyID: "ka", Route: "cache", CachedTokens: 9, Outcome: "done", FinishedAt: day1},
		{RequestID: "chat-a6", Tenant: "acme", User: "bob", KeyID: "kb", Outcome: "rejected", Reason: "queue_timeout", FinishedAt: day1},
	} {
		if _, err := s.Record(context.Background(), e); err != nil {
			t.Fatal(err)
		}
	}
}

// A tenant's query sums its own requests only, by each grouping, over
// [from, to) in UTC days.
func TestQueryGroupsATenantsOwnUsage(t *testing.T) {
	backends(t, func(t *testing.T, open opener) {
		s := open.must()
		seed(t, s)
		q := func(g GroupBy) []Row {
			rows, err := s.Query(context.Background(), Query{Tenant: "acme", From: day1, To: day1.AddDate(0, 0, 2), GroupBy: g})
			if err != nil {
				t.Fatal(err)
			}
			return rows
		}
		check := func(g GroupBy, want []Row) {
			t.Helper()
			if got := q(g); !reflect.DeepEqual(got, want) {
				t.Errorf("by %s:\n got %+v\nwant %+v", g, got, want)
			}
		}
		check(GroupDay, []Row{
			{Group: "2026-12-01", Requests: 4, Answered: 3, PromptTokens: 30, CompletionTokens: 12, CachedTokens: 9, TotalTokens: 42},
			{Group: "2026-12-02", Requests: 1, Answered: 1, PromptTokens: 1, CompletionTokens: 1, TotalTokens: 2},
		})
		check(GroupUser, []Row{
			{Group: "alice", Requests: 3, Answered: 3, PromptTokens: 11, CompletionTokens: 6, CachedTokens: 9, TotalTokens: 17},
			{Group: "bob", Requests: 2, Answered: 1, PromptTokens: 20, CompletionTokens: 7, TotalTokens: 27},
		})
		check(GroupKey, []Row{
			{Group: "ka", Requests: 3, Answered: 3, PromptTokens: 11, CompletionTokens: 6, CachedTokens: 9, TotalTokens: 17},
			{Group: "kb", Requests: 2, Answered: 1, PromptTokens: 20, CompletionTokens: 7, TotalTokens: 27},
		})
		check(GroupModel, []Row{
			{Group: "", Requests: 2, Answered: 1, CachedTokens: 9},
			{Group: "m1", Requests: 2, Answered: 2, PromptTokens: 11, CompletionTokens: 6, TotalTokens: 17},
			{Group: "m2", Requests: 1, Answered: 1, PromptTokens: 20, CompletionTokens: 7, TotalTokens: 27},
		})
		// By the class each was served in; requests from before classes
		// (and these without one) sum under "".
		check(GroupClass, []Row{
			{Group: "", Requests: 2, Answered: 1, CachedTokens: 9},
			{Group: "flex", Requests: 2, Answered: 2, PromptTokens: 21, CompletionTokens: 8, TotalTokens: 29},
			{Group: "priority", Requests: 1, Answered: 1, PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15},
		})
		// The budgets' grouping: spend is priced by the pool and the
		// model that answered there.
		check(GroupPool, []Row{
			{Group: "", Requests: 2, Answered: 1, CachedTokens: 9},
			{Group: "short", Model: "m1", Requests: 2, Answered: 2, PromptTokens: 11, CompletionTokens: 6, TotalTokens: 17},
			{Group: "short", Model: "m2", Requests: 1, Answered: 1, PromptTokens: 20, CompletionTokens: 7, TotalTokens: 27},
		})
		rows, err := s.Query(context.Background(), Query{Tenant: "nobody", From: day1, To: day1.AddDate(0, 0, 9), GroupBy: GroupDay})
		if err != nil || len(rows) != 0 {
			t.Fatalf("unknown tenant: %+v, %v", rows, err)
		}
	})
}

// Across tenants (the admins' query), users and keys stay apart by
// tenant, and a grouping by tenant gives each its total.
func TestQueryAcrossTenants(t *testing.T) {
	backends(t, func(t *testing.T, open opener) {
		s := open.must()
		seed(t, s)
		q := func(g GroupBy) []Row {
			rows, err := s.Query(context.Background(), Query{From: day1, To: day1.AddDate(0, 0, 1), GroupBy: g})
			if err != nil {
				t.Fatal(err)
			}
			return rows
		}
		if got, want := q(GroupTenant), []Row{
			{Tenant: "acme", Group: "acme", Requests: 4, Answered: 3, PromptTokens: 30, CompletionTokens: 12, CachedTokens: 9, TotalTokens: 42},
			{Tenant: "beta", Group: "beta", Requests: 1, Answered: 1, PromptTokens: 1000, CompletionTokens: 1000, TotalTokens: 2000},
		}; !reflect.DeepEqual(got, want) {
			t.Errorf("by tenant:\n got %+v\nwant %+v", got, want)
		}
		if got, want := q(GroupUser), []Row{
			{Tenant: "acme", Group: "alice", Requests: 2, Answered: 2, PromptTokens: 10, CompletionTokens: 5, CachedTokens: 9, TotalTokens: 15},
			{Tenant: "acme", Group: "bob", Requests: 2, Answered: 1, PromptTokens: 20, CompletionTokens: 7, TotalTokens: 27},
			{Tenant: "beta", Group: "alice", Requests: 1, Answered: 1, PromptTokens: 1000, CompletionTokens: 1000, TotalTokens: 2000},
		}; !reflect.DeepEqual(got, want) {
			t.Errorf("by user:\n got %+v\nwant %+v", got, want)
		}
		if got := q(GroupDay); len(got) != 1 || got[0].Requests != 5 || got[0].Tenant != "" {
			t.Errorf("by day across tenants: %+v", got)
		}
	})
}

// Opening a migrated ledger again, or from two processes at once (the
// API and the worker starting together), applies nothing twice.
func TestMigrationsApplyOnce(t *testing.T) {
	backends(t, func(t *testing.T, open opener) {
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := open.try(); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		s := open.must()
		var n int
		if err := s.db.SQL.QueryRow(`SELECT COUNT(*) FROM usage_schema_migrations`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		all, err := schema.Load()
		if err != nil {
			t.Fatal(err)
		}
		if n != len(all) {
			t.Fatalf("%d migrations recorded, %d exist", n, len(all))
		}
	})
}

func TestEntryValidation(t *testing.T) {
	s, err := OpenSQLite(context.Background(), SQLiteOptions{Path: filepath.Join(t.TempDir(), "u.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, e := range []Entry{
		{Tenant: "acme", FinishedAt: day1},
		{RequestID: "chat-x", FinishedAt: day1},
		{RequestID: "chat-x", Tenant: "acme"},
		{RequestID: "chat-x", Tenant: "acme", FinishedAt: day1, PromptTokens: -1},
	} {
		if _, err := s.Record(context.Background(), e); err == nil {
			t.Errorf("%+v recorded", e)
		}
	}
}

func TestParseGroupBy(t *testing.T) {
	if _, err := ParseGroupBy("tenant", false); err == nil {
		t.Error("a tenant's query grouped by tenant")
	}
	if g, err := ParseGroupBy("tenant", true); err != nil || g != GroupTenant {
		t.Errorf("admin by tenant: %v %v", g, err)
	}
	if _, err := ParseGroupBy("week", true); err == nil {
		t.Error("by week accepted")
	}
	if _, err := ParseGroupBy("pool", true); err == nil {
		t.Error("by pool, the budgets' own grouping, offered to the routes")
	}
}

// A PostgreSQL ledger out of reach does not stop its process from
// opening it: its records fail (for their workflows to retry) until it
// is back. A DSN that is no DSN is refused at once.
func TestPostgresOutOfReachAtStart(t *testing.T) {
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	s, err := OpenPostgres(fmt.Sprintf("postgres://postgres:secret@127.0.0.1:%d/usage?sslmode=disable&connect_timeout=2", port))
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer s.Close()
	_, err = s.Record(context.Background(), entry("chat-1", "acme", "alice", "k", "m", day1, 1, 1))
	if err == nil {
		t.Fatal("recorded into a ledger nobody serves")
	}
	if strings.Contains(err.Error(), "secret") {
		t.Fatalf("the error shows the password: %v", err)
	}
	if _, err := OpenPostgres("host=db port=notaport"); err == nil {
		t.Fatal("a malformed DSN opened")
	}
}
