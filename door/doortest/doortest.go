// Package doortest helps tests of what stands in front of the door: a Door
// that validates and parses without Redis or Temporal, and the checks the
// request parsers' fuzz targets share. Only tests import it.
package doortest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
	"go.temporal.io/sdk/client"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/holdings"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/tokens"
	"github.com/sluice-dev/sluice/worker"
)

// Parsers are what the request parsers need: the default config, its
// prompt builder and a Door for Validate and the parsers, whose Redis and
// Temporal clients point at nothing, so a test that reaches them fails.
func Parsers(t testing.TB) (config.Config, *prompt.Builder, *door.Door) {
	t.Helper()
	cfg := config.Default()
	tok, err := tokens.For(tokens.CL100K)
	if err != nil {
		t.Fatal(err)
	}
	prompts := prompt.NewBuilder(cfg.LLM.SystemPrompt, tok)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	log := events.NewLog(rdb, events.LogOptions{})
	gate, err := admission.New(rdb, admission.Options{Lease: time.Second, WaiterTTL: time.Second, MaxQueueDepth: 1,
		Limits: map[string]int{"short": 1, "long": 1}})
	if err != nil {
		t.Fatal(err)
	}
	live := worker.NewPolicy(rdb, cfg, gate, slog.Default())
	room, err := door.NewRoom(cfg, gate, live, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	d, err := door.New(door.Options{Config: cfg, Temporal: noTemporal{}, Events: log,
		Hub: events.NewHub(rdb, log, events.HubOptions{}), Gate: gate, Prompts: prompts,
		Policy: live, Room: room, Attacher: noAttacher{}, Returner: &holdings.Returner{Gate: gate}})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, prompts, d
}

// noTemporal is a Temporal client whose every call panics.
type noTemporal struct{ client.Client }

// noAttacher follows no request: a test that reaches it fails.
type noAttacher struct{}

func (noAttacher) Attach(context.Context, string, string) (*events.Subscription, error) {
	return nil, errors.New("doortest: no request to attach to")
}

// JSONContext is the echo context of a JSON POST of body.
func JSONContext(e *echo.Echo, body []byte) echo.Context {
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	req.Header.Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	return e.NewContext(req, httptest.NewRecorder())
}

// RequireRefusal fails unless err is a client error with a code and a
// message: the handlers would answer it 4xx with a JSON body.
func RequireRefusal(t *testing.T, body []byte, err error) {
	t.Helper()
	var ae *refusal.Error
	if !errors.As(err, &ae) {
		t.Fatalf("%q: refused with %T %v, not a refusal.Error (a 500)", body, err, err)
	}
	if s := httpio.Status(ae.Class); s < 400 || s > 499 || ae.Code == "" || ae.Message == "" {
		t.Fatalf("%q: refusal %+v is not a 4xx with a code and a message", body, ae)
	}
	if _, err := json.Marshal(map[string]*refusal.Error{"error": ae}); err != nil {
		t.Fatalf("%q: refusal cannot be rendered: %v", body, err)
	}
}

// RequireSentText fails if an accepted text holds U+FFFD that the body did
// not: the decoder replaced bytes or an escape the client sent.
func RequireSentText(t *testing.T, body []byte, texts ...string) {
	t.Helper()
	sent := bytes.Contains(body, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`))
	for _, text := range texts {
		if !sent && strings.ContainsRune(text, utf8.RuneError) {
			t.Fatalf("%q: accepted as %q, with a replacement character the client did not send", body, text)
		}
	}
}

// CheckChatInvariants fails unless req is what Door.Validate promises
// under cfg.
func CheckChatInvariants(t *testing.T, cfg config.Config, body []byte, req door.Request) {
	t.Helper()
	q := req.Query
	switch {
	case !utf8.Valid(body):
		t.Fatalf("%q: accepted a body that is not UTF-8", body)
	case q == "" || q != strings.TrimSpace(q) || !utf8.ValidString(q) || utf8.RuneCountInString(q) > cfg.API.MaxQueryChars:
		t.Fatalf("%q: accepted query %q", body, q)
	case req.KB == "":
		t.Fatalf("%q: accepted without a kb", body)
	case req.SessionID != "" && !door.ValidSessionID(req.SessionID):
		t.Fatalf("%q: accepted session id %q", body, req.SessionID)
	case req.MaxTokens == nil || *req.MaxTokens < 1 || *req.MaxTokens > cfg.API.MaxTokensLimit:
		t.Fatalf("%q: accepted max_tokens %v", body, req.MaxTokens)
	}
	// Not the kb: /v1/chat/completions may take it from a header, and an
	// unknown one is refused at the door.
	RequireSentText(t, body, req.Query, req.SessionID)
}
