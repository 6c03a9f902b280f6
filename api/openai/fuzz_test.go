package openai

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/door/doortest"
)

// The fuzz target runs the chat completions parser as the handler does, up
// to the first step that needs Redis or Temporal. Its seed corpus is under
// testdata/fuzz/FuzzCompletionRequest, and runs as an ordinary test.

// parserServer is a Server with what the parser needs and nothing else.
func parserServer(t testing.TB) *Server {
	t.Helper()
	cfg, prompts, d := doortest.Parsers(t)
	return New(Options{Config: cfg, Prompts: prompts, Door: d})
}

// parseCompletion is POST /v1/chat/completions up to the door.
func (s *Server) parseCompletion(body []byte, kb string) (completionRequest, door.Request, error) {
	raw, err := httpio.ReadJSONBody(doortest.JSONContext(echo.New(), body), s.cfg.API.MaxBodyBytes)
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
			doortest.RequireRefusal(t, body, err)
			return
		}
		doortest.CheckChatInvariants(t, s.cfg, body, req)
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
