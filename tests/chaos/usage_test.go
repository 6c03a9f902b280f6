package chaos

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/tests/chatclient"

	// The ledger's SQLite driver, to hold its write lock and read it.
	_ "modernc.org/sqlite"
)

// testUsageAcrossWorkerKill answers requests while the usage ledger
// refuses every write (the test holds its write lock), kills -9 the only
// worker before any of them was recorded — between each request's last
// token and its record — then lets the ledger go and starts the worker
// again: every request is in the ledger once, with the tokens its client
// was billed.
func testUsageAcrossWorkerKill(t *testing.T) {
	slow(t)
	path := filepath.Join(t.TempDir(), "usage.db")
	s := startStack(t, stackOptions{externalWorker: true, configure: func(c *config.Config) {
		c.Usage = config.Usage{Database: config.Database{Store: config.UsageSQLite, SQLitePath: path}}
	}})
	db, err := sql.Open("sqlite", "file:"+path+"?_busy_timeout=5000&_txlock=immediate")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	lock, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatalf("take the ledger's write lock: %v", err)
	}

	const n = 6
	rs := make([]*chatclient.Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rs[i] = s.send(ctx, tenantLoad, chatclient.Request{MaxTokens: 20, Bound: time.Minute})
		}()
	}
	wg.Wait()
	var extra []string
	for _, r := range rs {
		if r.Terminal != "done" {
			extra = append(extra, "not answered while the ledger refused writes: "+r.Summary())
		}
	}
	var before int
	if err := lock.QueryRowContext(ctx, `SELECT COUNT(*) FROM usage_records WHERE tenant = ?`, tenantLoad).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if before != 0 {
		t.Fatalf("%d requests recorded through the ledger's write lock", before)
	}
	if err := s.worker.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if err := s.worker.Start(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	recovered := time.Duration(-1)
	for time.Since(restarted) < 90*time.Second {
		var got int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM usage_records WHERE tenant = ?`, tenantLoad).Scan(&got); err == nil && got >= n {
			recovered = time.Since(restarted)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	extra = append(extra, ledgerMismatches(ctx, db, rs)...)
	s.finishScenario(t, row{fault: "worker killed (kill -9) after the answers, before their usage records (the ledger refusing writes)", recover: recovered,
		recoverTo: "worker started again → every request in the usage ledger",
		notes:     fmt.Sprintf("%d requests answered while the test held the SQLite ledger's write lock; the worker was killed with none recorded, the lock let go, the worker started 2 s later", n)},
		rs, extra, tenantLoad)
}

// ledgerMismatches compares the ledger with what each client saw: one
// record of its request, with the completion tokens its done event
// billed.
func ledgerMismatches(ctx context.Context, db *sql.DB, rs []*chatclient.Result) []string {
	var out []string
	for _, r := range rs {
		var rows, completion int
		err := db.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(completion_tokens), 0) FROM usage_records WHERE request_id = ?`, r.ID).Scan(&rows, &completion)
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("read the ledger for %s: %v", r.ID, err))
		case rows != 1:
			out = append(out, fmt.Sprintf("%s is in the ledger %d times", r.ID, rows))
		case completion != r.Completion:
			out = append(out, fmt.Sprintf("%s recorded %d completion tokens, its client was billed %d", r.ID, completion, r.Completion))
		}
	}
	return out
}
