package integration

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/usage"

	// The ledger's SQLite driver, to read it as an operator would.
	_ "modernc.org/sqlite"
)

// An answered request is in the usage ledger once its workflow closed,
// with who asked, the model and the tokens its done event billed; its
// tenant reads it back and another tenant does not.
func TestUsageLedgerRecordsTheRequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := open(t, ctx, http.MethodPost, "/v1/chat", `{"query":"How does a token bucket refill?","max_tokens":24}`,
		map[string]string{"Authorization": "Bearer " + keyAlice})
	defer s.close()
	evs := s.until(t, terminal)
	var done events.Done
	if last := evs[len(evs)-1]; last.Event != events.TypeDone || last.Decode(&done) != nil {
		t.Fatalf("last event %+v, want done", last)
	}
	result(t, s.id) // the workflow closed: its record is written
	recordHistory(t, s.id, "chat_usage_recorded")

	db, err := sql.Open("sqlite", "file:"+stack.usagePath+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var tenant, user, key, model, outcome string
	var prompt, completion int
	err = db.QueryRowContext(ctx, `SELECT tenant, user_name, key_id, model, outcome, prompt_tokens, completion_tokens
		FROM usage_records WHERE request_id = ?`, s.id).Scan(&tenant, &user, &key, &model, &outcome, &prompt, &completion)
	if err != nil {
		t.Fatalf("the ledger has no record of %s: %v", s.id, err)
	}
	if tenant != "it-acme" || user != "alice" || key == "" || outcome != request.OutcomeDone || model != done.Model ||
		prompt != done.Usage.PromptTokens || completion != done.Usage.CompletionTokens {
		t.Fatalf("record %s/%s/%s %s %s %d+%d, done %+v", tenant, user, key, model, outcome, prompt, completion, done.Usage)
	}

	day := usage.Day(time.Now())
	read := func(key, query string) []usage.Row {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, stack.baseURL+"/v1/usage?"+query, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b struct{ Rows []usage.Row }
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&b) != nil {
			t.Fatalf("GET /v1/usage?%s: %d", query, resp.StatusCode)
		}
		return b.Rows
	}
	rows := read(keyBob, "group_by=user")
	found := false
	for _, r := range rows {
		found = found || (r.Group == "alice" && r.Requests >= 1 && r.CompletionTokens >= int64(completion))
	}
	if !found {
		t.Fatalf("it-acme's usage by user %+v lacks alice's request", rows)
	}
	for _, r := range read(keyGus, "group_by=user&to="+usage.Day(time.Now().AddDate(0, 0, 1))) {
		if r.Group == "alice" || r.Group == "bob" {
			t.Fatalf("it-globex reads it-acme's usage: %+v (day %s)", r, day)
		}
	}
}
