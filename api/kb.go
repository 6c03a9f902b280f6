package api

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/retrieval"
	"github.com/sluice-dev/sluice/pkg/semaphore"
)

// ingestRequest is one document, or a batch under "documents".
type ingestRequest struct {
	ingest.Document
	Documents []ingest.Document `json:"documents"`
}

// errIngestBusy refuses a batch that found no permit within ingest.max_wait.
var errIngestBusy = &refusal.Error{Class: refusal.Unavailable, Code: "ingest_busy", RetryAfter: 5,
	Message: "Too many documents are being ingested right now. Please retry shortly."}

// ingestSlotHere takes one of this process's ingestion slots, waiting
// until deadline; release gives it back.
func (s *Server) ingestSlotHere(ctx context.Context, deadline time.Time) (release func(), err error) {
	wait := time.NewTimer(max(time.Until(deadline), 0))
	defer wait.Stop()
	select {
	case s.ingestHere <- struct{}{}:
		return func() { <-s.ingestHere }, nil
	case <-wait.C:
		return nil, errIngestBusy
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// postDocuments ingests documents into a kb: chunked, embedded and stored
// as one change (one new kb version). It holds an ingestion permit while
// it works; without one after ingest.max_wait it answers 503.
func (s *Server) postDocuments(c echo.Context) error {
	who, err := s.authenticateFor(c, policy.RouteIngest)
	if err != nil {
		return err
	}
	kb, err := s.door.KBs().Writable(who, c.Param("kb"))
	if err != nil {
		return err
	}
	if s.ingester == nil || s.ingestSlots == nil {
		return refusal.Unreachable("document ingestion is not configured in this process")
	}
	// The permits first, then the body: a body of up to
	// ingest.max_body_bytes is read only by a batch that may run, so the
	// bodies in memory are bounded by the permits, not by the clients:
	// this process's slot bounds its memory, the shared permit the
	// deployment's ingestion.
	id := door.NewRequestID()
	deadline := time.Now().Add(s.cfg.Ingest.MaxWait)
	release, err := s.ingestSlotHere(c.Request().Context(), deadline)
	if err != nil {
		return err
	}
	defer release()
	permit, err := s.ingestSlots.Acquire(c.Request().Context(), who.Tenant, id, max(time.Until(deadline), 0))
	if errors.Is(err, semaphore.ErrTimeout) {
		return errIngestBusy
	}
	if err != nil {
		s.logger.Error("acquire ingestion permit", "requestID", id, "err", err)
		return refusal.Unreachable("could not start the ingestion; please retry")
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
	var req ingestRequest
	if err := httpio.DecodeJSON(c, &req, s.cfg.Ingest.MaxBodyBytes); err != nil {
		return err
	}
	docs, err := s.documentsOf(req)
	if err != nil {
		return err
	}
	if err := s.door.CheckIngestQuota(ctx, who, kb, docs); err != nil {
		return err
	}
	res, err := s.ingester.Put(ctx, kb.Key(), docs)
	if errors.Is(err, ingest.ErrInvalid) {
		return refusal.BadRequest("bad_document", "%s", strings.TrimPrefix(err.Error(), ingest.ErrInvalid.Error()+": "))
	}
	if tl := (*kbstore.TooLarge)(nil); errors.As(err, &tl) {
		return &refusal.Error{Class: refusal.TooLarge, Code: request.ReasonKBTooLarge,
			Message: (&retrieval.TooLargeError{KB: kb.Name, Bytes: tl.Memory, Budget: tl.Max}).Error()}
	}
	if err != nil {
		s.logger.Error("ingest documents", "requestID", id, "kb", kb, "docs", len(docs), "err", err)
		return refusal.Unreachable("could not store the documents; please retry")
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
		return nil, refusal.BadRequest("bad_documents", "send one document or a \"documents\" list, not both")
	case single:
		docs = []ingest.Document{req.Document}
	case len(docs) == 0:
		return nil, refusal.BadRequest("bad_documents", "no documents: send {id, title, text, metadata} or {\"documents\": [...]}")
	case len(docs) > s.cfg.Ingest.MaxDocuments:
		return nil, &refusal.Error{Class: refusal.TooLarge, Code: "too_many_documents",
			Message: "at most " + strconv.Itoa(s.cfg.Ingest.MaxDocuments) + " documents per request"}
	}
	for i, d := range docs {
		// Markdown whose first line is "# Title" names itself.
		if d.Title == "" && strings.HasPrefix(strings.TrimLeft(d.Text, " \t\r\n"), "# ") {
			p := retrieval.ParseDocument(d.ID, d.Text)
			docs[i].Title, docs[i].Text = p.Title, p.Text
		}
		if err := s.ingester.Validate(docs[i]); err != nil {
			return nil, refusal.BadRequest("bad_document", "%s", strings.TrimPrefix(err.Error(), ingest.ErrInvalid.Error()+": "))
		}
	}
	return docs, nil
}

// deleteDocument removes one document from a kb.
func (s *Server) deleteDocument(c echo.Context) error {
	who, err := s.authenticateFor(c, policy.RouteIngest)
	if err != nil {
		return err
	}
	if s.kbStore == nil {
		return refusal.Unreachable("knowledge bases are not configured in this process")
	}
	kb, err := s.door.KBs().Writable(who, c.Param("kb"))
	if err != nil {
		return err
	}
	doc, err := documentID(c)
	if err != nil {
		return err
	}
	version, deleted, err := s.kbStore.Delete(c.Request().Context(), kb.Key(), doc)
	if err != nil {
		s.logger.Error("delete document", "kb", kb, "doc", doc, "err", err)
		return refusal.Unreachable("could not delete the document; please retry")
	}
	if !deleted {
		return &refusal.Error{Class: refusal.NotFound, Code: "not_found", Message: "no document " + doc + " in knowledge base " + kb.Name}
	}
	return c.JSON(http.StatusOK, map[string]any{"kb": kb.Name, "version": version, "deleted": doc})
}

// documentID is the document a DELETE names: the rest of its path, as
// sent literally ("guides/setup") or escaped as one segment
// ("guides%2Fsetup"). Echo routes an escaped path on its raw form and
// leaves the escapes in the parameter, so they are undone here.
func documentID(c echo.Context) (string, error) {
	id := c.Param("*")
	if c.Request().URL.RawPath != "" {
		var err error
		if id, err = url.PathUnescape(id); err != nil {
			return "", refusal.BadRequest("bad_document_id", "the document id does not unescape: %v", err)
		}
	}
	if id == "" {
		return "", refusal.BadRequest("bad_document_id", "name the document: DELETE /v1/kb/<kb>/documents/<id>")
	}
	return id, nil
}

// kbView is the body of GET /v1/kb/:kb.
type kbView struct {
	kbstore.Info
	// Shared: every tenant reads the kb and none may change it.
	Shared bool `json:"shared"`
	// NextCursor, when set, reads the next page (?cursor=).
	NextCursor string `json:"next_cursor,omitempty"`
}

// A page of GET /v1/kb/:kb holds defaultKBPage documents unless ?limit=
// asks for up to maxKBPage: at most ingest.max_metadata_bytes plus a
// title and id each, so an answer stays a few MiB at worst.
const (
	defaultKBPage = 100
	maxKBPage     = 200
)

// getKB describes a kb: version, counts, and a page of its documents.
func (s *Server) getKB(c echo.Context) error {
	who, err := s.authenticateFor(c, policy.RouteReads)
	if err != nil {
		return err
	}
	if s.kbStore == nil {
		return refusal.Unreachable("knowledge bases are not configured in this process")
	}
	name := c.Param("kb")
	if err := door.CheckName(name); err != nil {
		return err
	}
	page, err := kbPage(c.QueryParam("limit"), c.QueryParam("cursor"))
	if err != nil {
		return err
	}
	kb := s.door.KBs().Resolve(who, name)
	info, err := s.kbStore.Info(c.Request().Context(), kb.Key(), page)
	if err != nil {
		s.logger.Error("read kb", "kb", kb, "err", err)
		return refusal.Unreachable("could not read the knowledge base; please retry")
	}
	if info.Version == 0 {
		return &refusal.Error{Class: refusal.NotFound, Code: "not_found", Message: "no knowledge base " + name}
	}
	info.Name = kb.Name
	view := kbView{Info: info, Shared: kb.IsShared()}
	if info.Next != "" {
		view.NextCursor = base64.RawURLEncoding.EncodeToString([]byte(info.Next))
	}
	return c.JSON(http.StatusOK, view)
}

// kbPage reads GET /v1/kb/:kb's ?limit= and ?cursor=. A cursor is the
// next_cursor of an earlier page: opaque to clients, the last id of that
// page to the store.
func kbPage(limit, cursor string) (kbstore.Page, error) {
	page := kbstore.Page{Limit: defaultKBPage}
	if limit != "" {
		n, err := strconv.Atoi(limit)
		if err != nil || n < 1 || n > maxKBPage {
			return page, refusal.BadRequest("bad_limit", "limit must be a whole number from 1 to %d, got %.40q", maxKBPage, limit)
		}
		page.Limit = n
	}
	if cursor != "" {
		after, err := base64.RawURLEncoding.DecodeString(cursor)
		if err != nil || len(after) == 0 || len(after) > ingest.MaxIDBytes || !utf8.Valid(after) {
			return page, refusal.BadRequest("bad_cursor", "cursor must be the next_cursor of an earlier page")
		}
		page.After = string(after)
	}
	return page, nil
}

// listKBs names the kbs the caller may name: its tenant's own and the
// shared ones ("kbs"), and which of them are shared ("shared").
func (s *Server) listKBs(c echo.Context) error {
	who, err := s.authenticateFor(c, policy.RouteReads)
	if err != nil {
		return err
	}
	if s.kbStore == nil {
		return refusal.Unreachable("knowledge bases are not configured in this process")
	}
	names, err := s.readableKBs(c.Request().Context(), who)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"kbs": names, "shared": s.door.KBs().Shared()})
}

// readableKBs are the names of the kbs who may ask (door.KBs.Readable).
func (s *Server) readableKBs(ctx context.Context, who door.Caller) ([]string, error) {
	names, err := s.door.KBs().Readable(ctx, who)
	if err != nil {
		s.logger.Error("list kbs", "tenant", who.Tenant, "err", err)
		return nil, refusal.Unreachable("could not list knowledge bases; please retry")
	}
	return names, nil
}
