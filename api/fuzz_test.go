package api

import (
	"encoding/json"
	"maps"
	"testing"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/door/doortest"
	"github.com/sluice-dev/sluice/pkg/ingest"
)

// The fuzz targets run the request parsers as the handlers do, up to the
// first step that needs Redis or Temporal. Their seed corpora are under
// testdata/fuzz/<name>, and run as ordinary tests.

// parserServer is a Server with what the parsers need and nothing else.
func parserServer(t testing.TB) *Server {
	t.Helper()
	cfg, prompts, d := doortest.Parsers(t)
	return &Server{cfg: cfg, echo: echo.New(), prompts: prompts, door: d, ingester: &ingest.Ingester{MaxMetadataBytes: cfg.Ingest.MaxMetadataBytes}}
}

// jsonContext is the echo context of a JSON POST of body.
func (s *Server) jsonContext(body []byte) echo.Context { return doortest.JSONContext(s.echo, body) }

// parseChat is POST /v1/chat up to the door.
func (s *Server) parseChat(body []byte) (door.Request, error) {
	return s.chatRequest(s.jsonContext(body))
}

func FuzzChatRequest(f *testing.F) {
	s := parserServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := s.parseChat(body)
		if err != nil {
			doortest.RequireRefusal(t, body, err)
			return
		}
		doortest.CheckChatInvariants(t, s.cfg, body, req)
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
			doortest.RequireRefusal(t, body, err)
			return
		}
		if !utf8.Valid(body) {
			t.Fatalf("%q: accepted a body that is not UTF-8", body)
		}
		if len(docs) == 0 || len(docs) > s.cfg.Ingest.MaxDocuments {
			t.Fatalf("%q: accepted %d documents", body, len(docs))
		}
		for _, d := range docs {
			if err := s.ingester.Validate(d); err != nil {
				t.Fatalf("%q: accepted %+v: %v", body, d, err)
			}
			doortest.RequireSentText(t, body, d.ID, d.Title, d.Text)
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
