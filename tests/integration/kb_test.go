package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
)

// doJSON sends a JSON request to the API and decodes a 2xx answer.
func doJSON(t *testing.T, ctx context.Context, method, path, body string, out any) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, stack.baseURL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, path, err, raw)
		}
	}
}

// ask sends a chat request and returns its done event.
func ask(t *testing.T, ctx context.Context, body string) events.Done {
	t.Helper()
	s := chat(t, ctx, body)
	defer s.close()
	evs := s.until(t, terminal)
	var done events.Done
	if last := evs[len(evs)-1]; last.Event != events.TypeDone || last.Decode(&done) != nil {
		t.Fatalf("ended with %+v", last)
	}
	return done
}

// Ingest → ask → the answer's context holds the ingested document (in the
// anonymous tenant's own kb, whose key its cache entries carry); delete
// → the next ask no longer retrieves it (its cache entry is gone too),
// while another kb's cache entries are untouched.
func TestIngestAskDelete(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var put struct {
		Version int64 `json:"version"`
	}
	doJSON(t, ctx, "POST", "/v1/kb/it-animals/documents", `{"documents":[
		{"id":"quokka","title":"Quokkas","text":"Quokkas are small marsupials from Rottnest Island. At night quokkas eat grasses, leaves and succulent stems, and they can go long periods without drinking."},
		{"id":"wombat","title":"Wombats","text":"Wombats dig burrows with their strong claws. Their droppings are cube-shaped, which stops them rolling away."}]}`, &put)
	if put.Version != 1 {
		t.Fatalf("version %d after the first ingestion", put.Version)
	}
	// Something cached for another kb, to check it survives.
	ask(t, ctx, `{"query":"How does a token bucket refill?","max_tokens":8}`)
	others, _ := stack.redis.Keys(ctx, keyPrefix+"ret:{sluice-docs}:*").Result()
	if len(others) == 0 {
		t.Fatal("no cache entry for the built-in kb")
	}

	const q = `{"query":"What do quokkas eat at night?","kb":"it-animals","max_tokens":8}`
	done := ask(t, ctx, q)
	if done.KBVersion != 1 || !slices.Contains(done.Sources, "quokka") {
		t.Fatalf("done %+v: want the quokka document at version 1", done)
	}
	if mine, _ := stack.redis.Keys(ctx, keyPrefix+"ret:{anonymous/it-animals}:*").Result(); len(mine) == 0 {
		t.Fatal("the answer's retrieval was not cached")
	}

	doJSON(t, ctx, "DELETE", "/v1/kb/it-animals/documents/quokka", "", nil)
	if mine, _ := stack.redis.Keys(ctx, keyPrefix+"ret:{anonymous/it-animals}:*").Result(); len(mine) != 0 {
		t.Fatalf("cache entries holding the deleted document survive: %v", mine)
	}
	if still, _ := stack.redis.Keys(ctx, keyPrefix+"ret:{sluice-docs}:*").Result(); len(still) < len(others) {
		t.Fatalf("another kb's cache entries went: %d of %d left", len(still), len(others))
	}
	done = ask(t, ctx, q)
	if done.KBVersion != 2 || slices.Contains(done.Sources, "quokka") {
		t.Fatalf("done %+v: the deleted document was retrieved, or the version did not move", done)
	}
}
