package multi

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	// pgx's database/sql driver, as pkg/usage opens the ledger with.
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/usage"
	"github.com/sluice-dev/sluice/tests/chatclient"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// watchLedgerAttempts makes the ledger at dsn keep every row a process
// tries to record, in usage_record_attempts, before the primary key
// drops a repeat (the insert is ON CONFLICT DO NOTHING): PostgreSQL runs
// a BEFORE INSERT row trigger for each row proposed, skipped or not. It
// migrates the ledger first, as the processes would.
func watchLedgerAttempts(ctx context.Context, dsn string) error {
	ledger, err := usage.OpenPostgres(dsn)
	if err != nil {
		return err
	}
	defer ledger.Close()
	if err := ledger.Migrate(ctx); err != nil {
		return err
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return fmt.Errorf("open the usage ledger: %w", err)
	}
	defer db.Close()
	for _, stmt := range []string{
		`CREATE TABLE IF NOT EXISTS usage_record_attempts (LIKE usage_records)`,
		`CREATE OR REPLACE FUNCTION usage_record_attempt() RETURNS trigger AS $$
		BEGIN
			INSERT INTO usage_record_attempts SELECT NEW.*;
			RETURN NEW;
		END $$ LANGUAGE plpgsql`,
		`DROP TRIGGER IF EXISTS usage_record_attempt ON usage_records`,
		`CREATE TRIGGER usage_record_attempt BEFORE INSERT ON usage_records FOR EACH ROW EXECUTE FUNCTION usage_record_attempt()`,
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("watch the ledger's record attempts: %w", err)
		}
	}
	return nil
}

// checkLedgerOnce checks that every request of rs that its workflow
// ended, answered (done) or failed (error: stream_interrupted, say), is
// in the cluster's usage ledger (PostgreSQL) exactly once, with the
// completion tokens its done event billed when it was answered. A
// rejected request may have ended at the door, before any workflow, and
// is not checked.
// A record is written by the request's finalisation, after its terminal
// event, so the check waits a little for the last ones.
func checkLedgerOnce(t *testing.T, s *stack, rs []*chatclient.Result) {
	t.Helper()
	db, err := sql.Open("pgx", s.cfg.Usage.PostgresDSN)
	if err != nil {
		t.Fatalf("open the usage ledger: %v", err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var problems []string
	for {
		problems = ledgerProblems(ctx, db, rs)
		if len(problems) == 0 || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Second)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if n, err := retriedRecords(ctx, db); err == nil {
		t.Logf("usage ledger: %d requests recorded more than once, the same settlement each time", n)
	}
}

// ledgerProblems are the requests of rs not settled exactly once: not in
// the ledger once, settled more than one way (the attempts to record a
// request, counted before the primary key drops repeats, differ: two
// finalisations, say, of which the first won), or billed other than
// their done event said. Repeated attempts of one settlement are an
// idempotent record retried (a worker killed after writing, before it
// reported), and are logged.
func ledgerProblems(ctx context.Context, db *sql.DB, rs []*chatclient.Result) []string {
	var out []string
	for _, r := range rs {
		if r.ID == "" || (r.Terminal != events.TypeDone && r.Terminal != events.TypeError) {
			continue
		}
		var rows, completion, attempts, settlements int
		err := db.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(completion_tokens), 0) FROM usage_records WHERE request_id = $1`, r.ID).Scan(&rows, &completion)
		if err == nil {
			err = db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT (tenant, user_name, key_id, model, pool, route, prompt_tokens,
				completion_tokens, cached_tokens, outcome, reason, finished_at)) FROM usage_record_attempts WHERE request_id = $1`, r.ID).Scan(&attempts, &settlements)
		}
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("read the ledger for %s: %v", r.ID, err))
		case rows != 1:
			out = append(out, fmt.Sprintf("%s (%s) is in the ledger %d times, want once", r.ID, r.Terminal, rows))
		case settlements != 1:
			out = append(out, fmt.Sprintf("%s (%s) was settled %d different ways in %d attempts to record it, want one", r.ID, r.Terminal, settlements, attempts))
		case r.Terminal == "done" && completion != r.Completion:
			out = append(out, fmt.Sprintf("%s: the ledger has %d completion tokens, its done event billed %d", r.ID, completion, r.Completion))
		}
	}
	return out
}

// retriedRecords counts the requests the ledger was asked to record more
// than once.
func retriedRecords(ctx context.Context, db *sql.DB) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM (SELECT request_id FROM usage_record_attempts GROUP BY request_id HAVING COUNT(*) > 1) r`).Scan(&n)
	return n, err
}

// The ledger check sees a request settled twice, which the ledger's
// primary key hides (one row either way), and lets a retried record of
// one settlement pass.
func TestLedgerCheckSeesEverySettlement(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg, err := testenv.StartPostgres(ctx, 0, io.Discard)
	if errors.Is(err, testenv.ErrNoPostgres) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop() })
	if err := pg.CreateDatabase(ctx, "ledger"); err != nil {
		t.Fatal(err)
	}
	dsn := pg.DSN("ledger")
	if err := watchLedgerAttempts(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	ledger, err := usage.OpenPostgres(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Close()
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	entry := func(id, outcome string) usage.Entry {
		return usage.Entry{RequestID: id, Tenant: "acme", User: "alice", Model: "m", Pool: "short", Route: "short",
			PromptTokens: 10, CompletionTokens: 5, Outcome: outcome, FinishedAt: at}
	}
	for _, e := range []usage.Entry{
		entry("once", "done"),
		entry("retried", "done"), entry("retried", "done"),
		entry("twice", "done"), entry("twice", "error"),
	} {
		if _, err := ledger.Record(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var rs []*chatclient.Result
	for _, id := range []string{"once", "retried", "twice"} {
		rs = append(rs, &chatclient.Result{ID: id, Terminal: events.TypeDone, Completion: 5})
	}
	problems := ledgerProblems(ctx, db, rs)
	if len(problems) != 1 || !strings.Contains(problems[0], "twice (done) was settled 2 different ways in 2 attempts") {
		t.Fatalf("problems %q, want the request settled twice alone", problems)
	}
	if n, err := retriedRecords(ctx, db); err != nil || n != 2 {
		t.Fatalf("%d requests recorded more than once (%v), want 2", n, err)
	}
}
