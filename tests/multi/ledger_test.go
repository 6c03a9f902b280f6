package multi

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	// pgx's database/sql driver, as pkg/usage opens the ledger with.
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/tests/chatclient"
)

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
}

func ledgerProblems(ctx context.Context, db *sql.DB, rs []*chatclient.Result) []string {
	var out []string
	for _, r := range rs {
		if r.ID == "" || (r.Terminal != events.TypeDone && r.Terminal != events.TypeError) {
			continue
		}
		var rows, completion int
		err := db.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(completion_tokens), 0) FROM usage_records WHERE request_id = $1`, r.ID).Scan(&rows, &completion)
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("read the ledger for %s: %v", r.ID, err))
		case rows != 1:
			out = append(out, fmt.Sprintf("%s (%s) is in the ledger %d times, want once", r.ID, r.Terminal, rows))
		case r.Terminal == "done" && completion != r.Completion:
			out = append(out, fmt.Sprintf("%s: the ledger has %d completion tokens, its done event billed %d", r.ID, completion, r.Completion))
		}
	}
	return out
}
