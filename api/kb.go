package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/pkg/semaphore"
)

// ingestRequest is one document, or a batch under "documents".
type ingestRequest struct {
	ingest.Document
	Documents []ingest.Document `json:"documents"`
}

// postDocuments ingests documents into a kb: chunked, embedded and stored
// as one change (one new kb version). It holds an ingestion permit while
// it works; without one after ingest.max_wait it answers 503.
func (s *Server) postDocuments(c echo.Context) error {
	if _, err := s.authenticate(c); err != nil {
		return err
	}
	kb := c.Param("kb")
	if err := checkKBName(kb); err != nil {
		return err
	}
	var req ingestRequest
	if err := s.decodeJSONLimit(c, &req, s.cfg.Ingest.MaxBodyBytes); err != nil {
		return err
	}
	docs, err := s.documentsOf(req)
	if err != nil {
		return err
	}
	if s.ingester == nil || s.ingestSlots == nil {
		return unavailable("document ingestion is not configured in this process")
	}
	id := newRequestID()
	permit, err := s.ingestSlots.Acquire(c.Request().Context(), id, s.cfg.Ingest.MaxWait)
	if errors.Is(err, semaphore.ErrTimeout) {
		return &apiError{Status: http.StatusServiceUnavailable, Code: "ingest_busy", RetryAfter: 5,
			Message: "Too many documents are being ingested right now. Please retry shortly."}
	}
	if err != nil {
		s.logger.Error("acquire ingestion permit", "requestID", id, "err", err)
		return unavailable("could not start the ingestion; please retry")
	}
	defer func() {
		if err := permit.Release(context.WithoutCancel(c.Request().Context())); err != nil {
			s.logger.Warn("release ingestion permit", "requestID", id, "err", err)
		}
	}()
	// A lost lease means another ingestion may now run in its place; the
	// work is stopped rather than exceed the limit.
	ctx, cancel := context.WithCancel(c.Request().Context())
	defer cancel()
	go func() {
		select {
		case <-permit.Lost():
			cancel()
		case <-ctx.Done():
		}
	}()
	res, err := s.ingester.Put(ctx, kb, docs)
	if errors.Is(err, ingest.ErrInvalid) {
		return badRequest("bad_document", "%s", strings.TrimPrefix(err.Error(), ingest.ErrInvalid.Error()+": "))
	}
	if err != nil {
		s.logger.Error("ingest documents", "requestID", id, "kb", kb, "docs", len(docs), "err", err)
		return unavailable("could not store the documents; please retry")
	}
	s.logger.Info("ingested documents", "requestID", id, "kb", kb, "docs", len(docs), "version", res.Version)
	return c.JSON(http.StatusOK, res)
}

// documentsOf is the checked list of documents a request sends: the one
// document of its top level or its "documents" list, each valid, a
// Markdown title lifted out of its text.
func (s *Server) documentsOf(req ingestRequest) ([]ingest.Document, error) {
	docs := req.Documents
	single := req.Document.ID != "" || req.Document.Text != "" || req.Document.Title != "" || req.Document.Metadata != nil
	switch {
	case single && len(docs) > 0:
		return nil, badRequest("bad_documents", "send one document or a \"documents\" list, not both")
	case single:
		docs = []ingest.Document{req.Document}
	case len(docs) == 0:
		return nil, badRequest("bad_documents", "no documents: send {id, title, text, metadata} or {\"documents\": [...]}")
	case len(docs) > s.cfg.Ingest.MaxDocuments:
		return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Code: "too_many_documents",
			Message: "at most " + strconv.Itoa(s.cfg.Ingest.MaxDocuments) + " documents per request"}
	}
	for i, d := range docs {
		// Markdown whose first line is "# Title" names itself.
		if d.Title == "" && strings.HasPrefix(strings.TrimLeft(d.Text, " \t\r\n"), "# ") {
			p := retrieval.ParseDocument(d.ID, d.Text)
			docs[i].Title, docs[i].Text = p.Title, p.Text
		}
		if err := ingest.Validate(docs[i]); err != nil {
			return nil, badRequest("bad_document", "%s", strings.TrimPrefix(err.Error(), ingest.ErrInvalid.Error()+": "))
		}
	}
	return docs, nil
}

// deleteDocument removes one document from a kb.
func (s *Server) deleteDocument(c echo.Context) error {
	if _, err := s.authenticate(c); err != nil {
		return err
	}
	if s.kbStore == nil {
		return unavailable("knowledge bases are not configured in this process")
	}
	kb, doc := c.Param("kb"), c.Param("id")
	if err := checkKBName(kb); err != nil {
		return err
	}
	version, deleted, err := s.kbStore.Delete(c.Request().Context(), kb, doc)
	if err != nil {
		s.logger.Error("delete document", "kb", kb, "doc", doc, "err", err)
		return unavailable("could not delete the document; please retry")
	}
	if !deleted {
		return &apiError{Status: http.StatusNotFound, Code: "not_found", Message: "no document " + doc + " in knowledge base " + kb}
	}
	return c.JSON(http.StatusOK, map[string]any{"kb": kb, "version": version, "deleted": doc})
}

// getKB describes a kb: version, documents, chunks.
func (s *Server) getKB(c echo.Context) error {
	if _, err := s.authenticate(c); err != nil {
		return err
	}
	if s.kbStore == nil {
		return unavailable("knowledge bases are not configured in this process")
	}
	kb := c.Param("kb")
	if err := checkKBName(kb); err != nil {
		return err
	}
	info, err := s.kbStore.Info(c.Request().Context(), kb)
	if err != nil {
		s.logger.Error("read kb", "kb", kb, "err", err)
		return unavailable("could not read the knowledge base; please retry")
	}
	if info.Version == 0 {
		return &apiError{Status: http.StatusNotFound, Code: "not_found", Message: "no knowledge base " + kb}
	}
	return c.JSON(http.StatusOK, info)
}

// listKBs names every kb.
func (s *Server) listKBs(c echo.Context) error {
	if _, err := s.authenticate(c); err != nil {
		return err
	}
	if s.kbStore == nil {
		return unavailable("knowledge bases are not configured in this process")
	}
	names, err := s.kbStore.KBs(c.Request().Context())
	if err != nil {
		s.logger.Error("list kbs", "err", err)
		return unavailable("could not list knowledge bases; please retry")
	}
	return c.JSON(http.StatusOK, map[string]any{"kbs": append([]string{}, names...)})
}

// checkKBName refuses a kb name that cannot name a kb.
func checkKBName(kb string) error {
	if !ingest.ValidKBName(kb) {
		return badRequest("bad_kb", "knowledge base names are 1-64 letters, digits, '-', '_' or '.'")
	}
	return nil
}

// kbKnown reports whether a chat request may name kb. A kb, once
// written, is never removed (only its documents are), so a yes is
// remembered: a flood naming a real kb costs Redis nothing here.
func (s *Server) kbKnown(ctx context.Context, kb string) (bool, error) {
	if s.kbStore == nil || s.kbs[kb] {
		// A configured kb is known even while Redis lacks it (it
		// restarted empty): the workers seed it again.
		return s.kbs[kb], nil
	}
	if _, ok := s.seenKBs.Load(kb); ok {
		return true, nil
	}
	if !ingest.ValidKBName(kb) {
		return false, nil
	}
	v, err := s.kbStore.Version(ctx, kb)
	if v > 0 {
		s.seenKBs.Store(kb, struct{}{})
	}
	return v > 0, err
}
