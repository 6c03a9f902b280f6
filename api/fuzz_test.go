package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/httperr"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/tokens"
	"github.com/sluice-dev/sluice/workflows"
	"github.com/sluice-dev/sluice/workflows/settings"
)

// The fuzz targets run the request parsers as the handlers do, up to the
// first step that needs Redis or Temporal. Their seed corpora are under
// testdata/fuzz/<name>, and run as ordinary tests.

// parserServer is a Server with what the parsers need and nothing else.
func parserServer(t testing.TB) *Server {
	t.Helper()
	cfg := config.Default()
	tok, err := tokens.For(tokens.CL100K)
	if err != nil {
		t.Fatal(err)
	}
	prompts := prompt.NewBuilder(cfg.LLM.SystemPrompt, tok)
	// Clients of an address nothing listens on: the parsers never call
	// them, and a call would fail the target.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	log := events.NewLog(rdb, events.LogOptions{})
	gate, err := admission.New(rdb, admission.Options{Lease: time.Second, WaiterTTL: time.Second, MaxQueueDepth: 1, Limits: map[string]int{"short": 1, "long": 1}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := door.New(door.Options{Config: cfg, Temporal: &countingClient{}, Redis: rdb, Events: log, Hub: events.NewHub(rdb, log, events.HubOptions{}),
		Gate: gate, Prompts: prompts, Policy: policy.NewStore(rdb, cfg, gate, slog.Default()),
		Settings: func(t config.Tier) workflows.ChatSettings { return settings.Chat(cfg, t) }})
	if err != nil {
		t.Fatal(err)
	}
	return &Server{cfg: cfg, echo: echo.New(), prompts: prompts, door: d}
}

// jsonContext is the echo context of a JSON POST of body.
func (s *Server) jsonContext(body []byte) echo.Context {
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	req.Header.Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	return s.echo.NewContext(req, httptest.NewRecorder())
}

// requireRefusal fails unless err is a client error with a code and a
// message: the handlers would answer it 4xx with a JSON body.
func requireRefusal(t *testing.T, body []byte, err error) {
	t.Helper()
	var ae *httperr.Error
	if !errors.As(err, &ae) {
		t.Fatalf("%q: refused with %T %v, not an httperr.Error (a 500)", body, err, err)
	}
	if ae.Status < 400 || ae.Status > 499 || ae.Code == "" || ae.Message == "" {
		t.Fatalf("%q: refusal %+v is not a 4xx with a code and a message", body, ae)
	}
	if _, err := json.Marshal(map[string]*httperr.Error{"error": ae}); err != nil {
		t.Fatalf("%q: refusal cannot be rendered: %v", body, err)
	}
}

// parseChat is POST /v1/chat up to the door.
func (s *Server) parseChat(body []byte) (door.Request, error) {
	var req door.Request
	if err := httpio.DecodeJSON(s.jsonContext(body), &req, s.cfg.API.MaxBodyBytes); err != nil {
		return req, err
	}
	return req, s.door.Validate(&req)
}

// requireSentText fails if an accepted text holds U+FFFD that the body did
// not: the decoder replaced bytes or an escape the client sent.
func requireSentText(t *testing.T, body []byte, texts ...string) {
	t.Helper()
	sent := bytes.Contains(body, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(body), []byte(`\ufffd`))
	for _, text := range texts {
		if !sent && strings.ContainsRune(text, utf8.RuneError) {
			t.Fatalf("%q: accepted as %q, with a replacement character the client did not send", body, text)
		}
	}
}

// checkChatInvariants fails unless req is what validate promises.
func checkChatInvariants(t *testing.T, s *Server, body []byte, req door.Request) {
	t.Helper()
	q := req.Query
	switch {
	case !utf8.Valid(body):
		t.Fatalf("%q: accepted a body that is not UTF-8", body)
	case q == "" || q != strings.TrimSpace(q) || !utf8.ValidString(q) || utf8.RuneCountInString(q) > s.cfg.API.MaxQueryChars:
		t.Fatalf("%q: accepted query %q", body, q)
	case req.KB == "":
		t.Fatalf("%q: accepted without a kb", body)
	case req.SessionID != "" && !door.ValidSessionID(req.SessionID):
		t.Fatalf("%q: accepted session id %q", body, req.SessionID)
	case req.MaxTokens == nil || *req.MaxTokens < 1 || *req.MaxTokens > s.cfg.API.MaxTokensLimit:
		t.Fatalf("%q: accepted max_tokens %v", body, req.MaxTokens)
	}
	// Not the kb: /v1/chat/completions may take it from a header, and an
	// unknown one is refused at the door.
	requireSentText(t, body, req.Query, req.SessionID)
}

func FuzzChatRequest(f *testing.F) {
	s := parserServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := s.parseChat(body)
		if err != nil {
			requireRefusal(t, body, err)
			return
		}
		checkChatInvariants(t, s, body, req)
		// What was accepted, sent again as it now is, is accepted as is.
		again, err := json.Marshal(map[string]any{"query": req.Query, "kb": req.KB, "session_id": req.SessionID, "max_tokens": *req.MaxTokens})
		if err != nil {
			t.Fatal(err)
		}
		req2, err := s.parseChat(again)
		if err != nil || req2.Query != req.Query || req2.KB != req.KB || req2.SessionID != req.SessionID || *req2.MaxTokens != *req.MaxTokens {
			t.Fatalf("%q accepted as %+v, but %s gives %+v, %v", body, req, again, req2, err)
		}
	})
}

// parseCompletion is POST /v1/chat/completions up to the door.
func (s *Server) parseCompletion(body []byte, kb string) (completionRequest, door.Request, error) {
	raw, err := httpio.ReadJSONBody(s.jsonContext(body), s.cfg.API.MaxBodyBytes)
	if err != nil {
		return completionRequest{}, door.Request{}, err
	}
	cr, req, err := parseCompletionRequest(raw, kb)
	if err != nil {
		return cr, req, err
	}
	return cr, req, withParam(s.door.Validate(&req))
}

func FuzzCompletionRequest(f *testing.F) {
	s := parserServer(f)
	f.Fuzz(func(t *testing.T, body []byte, kb string) {
		cr, req, err := s.parseCompletion(body, kb)
		if err != nil {
			requireRefusal(t, body, err)
			return
		}
		checkChatInvariants(t, s, body, req)
		if (req.Gateway && cr.Model == "") || (cr.N != nil && *cr.N != 1) {
			t.Fatalf("%q: accepted model %q, n %v", body, cr.Model, cr.N)
		}
		if len(req.Conversation) != len(cr.Messages) {
			t.Fatalf("%q: %d messages of %d forwarded", body, len(req.Conversation), len(cr.Messages))
		}
		// In RAG mode the query is the last user message with text; a
		// gateway request has none.
		var last string
		for _, m := range cr.Messages {
			if text, _ := m.Text(); m.Role == "user" && strings.TrimSpace(text) != "" {
				last = text
			}
		}
		if req.Gateway {
			last = ""
		}
		if strings.TrimSpace(last) != req.Query {
			t.Fatalf("%q: query %q is not the last user message %q", body, req.Query, last)
		}
		again, err := json.Marshal(cr)
		if err != nil {
			t.Fatal(err)
		}
		cr2, req2, err := s.parseCompletion(again, kb)
		if err != nil || req2.Query != req.Query || req2.KB != req.KB || *req2.MaxTokens != *req.MaxTokens || cr2.Model != cr.Model || cr2.Stream != cr.Stream {
			t.Fatalf("%q accepted as %+v, but %s gives %+v, %v", body, req, again, req2, err)
		}
	})
}

// parseDocuments is POST /v1/kb/:kb/documents up to the ingestion.
func (s *Server) parseDocuments(body []byte) ([]ingest.Document, error) {
	var req ingestRequest
	if err := httpio.DecodeJSON(s.jsonContext(body), &req, s.cfg.Ingest.MaxBodyBytes); err != nil {
		return nil, err
	}
	return s.documentsOf(req)
}

func FuzzDocuments(f *testing.F) {
	s := parserServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		docs, err := s.parseDocuments(body)
		if err != nil {
			requireRefusal(t, body, err)
			return
		}
		if !utf8.Valid(body) {
			t.Fatalf("%q: accepted a body that is not UTF-8", body)
		}
		if len(docs) == 0 || len(docs) > s.cfg.Ingest.MaxDocuments {
			t.Fatalf("%q: accepted %d documents", body, len(docs))
		}
		for _, d := range docs {
			if err := ingest.Validate(d); err != nil {
				t.Fatalf("%q: accepted %+v: %v", body, d, err)
			}
			requireSentText(t, body, d.ID, d.Title, d.Text)
		}
		// The documents as they will be stored, sent again, are stored
		// the same: a title taken from the text is not taken twice.
		again, err := json.Marshal(map[string]any{"documents": docs})
		if err != nil {
			t.Fatal(err)
		}
		docs2, err := s.parseDocuments(again)
		if err != nil || !sameDocuments(docs, docs2) {
			t.Fatalf("%q accepted as %+v, but %s gives %+v, %v", body, docs, again, docs2, err)
		}
	})
}

// sameDocuments compares documents, an empty metadata map equal to none.
func sameDocuments(a, b []ingest.Document) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || a[i].Title != b[i].Title || a[i].Text != b[i].Text || !maps.Equal(a[i].Metadata, b[i].Metadata) {
			return false
		}
	}
	return true
}
