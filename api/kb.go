package api

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/ingest"
	"github.com/sluice-dev/sluice/pkg/kbref"
	"github.com/sluice-dev/sluice/pkg/kbstore"
	"github.com/sluice-dev/sluice/pkg/keys"
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
	who, err := s.authenticateFor(c, config.RouteIngest)
	if err != nil {
		return err
	}
	kb, err := s.writableKB(who, c.Param("kb"))
	if err != nil {
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
	if err := s.checkIngestQuota(ctx, who, kb, docs); err != nil {
		return err
	}
	res, err := s.ingester.Put(ctx, kb.Key(), docs)
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
	who, err := s.authenticateFor(c, config.RouteIngest)
	if err != nil {
		return err
	}
	if s.kbStore == nil {
		return unavailable("knowledge bases are not configured in this process")
	}
	kb, err := s.writableKB(who, c.Param("kb"))
	if err != nil {
		return err
	}
	doc := c.Param("id")
	version, deleted, err := s.kbStore.Delete(c.Request().Context(), kb.Key(), doc)
	if err != nil {
		s.logger.Error("delete document", "kb", kb, "doc", doc, "err", err)
		return unavailable("could not delete the document; please retry")
	}
	if !deleted {
		return &apiError{Status: http.StatusNotFound, Code: "not_found", Message: "no document " + doc + " in knowledge base " + kb.Name}
	}
	return c.JSON(http.StatusOK, map[string]any{"kb": kb.Name, "version": version, "deleted": doc})
}

// kbView is the body of GET /v1/kb/:kb.
type kbView struct {
	kbstore.Info
	// Shared: every tenant reads the kb and none may change it.
	Shared bool `json:"shared"`
}

// getKB describes a kb: version, documents, chunks.
func (s *Server) getKB(c echo.Context) error {
	who, err := s.authenticateFor(c, config.RouteReads)
	if err != nil {
		return err
	}
	if s.kbStore == nil {
		return unavailable("knowledge bases are not configured in this process")
	}
	name := c.Param("kb")
	if err := checkKBName(name); err != nil {
		return err
	}
	kb := s.resolveKB(who, name)
	info, err := s.kbStore.Info(c.Request().Context(), kb.Key())
	if err != nil {
		s.logger.Error("read kb", "kb", kb, "err", err)
		return unavailable("could not read the knowledge base; please retry")
	}
	if info.Version == 0 {
		return &apiError{Status: http.StatusNotFound, Code: "not_found", Message: "no knowledge base " + name}
	}
	info.Name = kb.Name
	return c.JSON(http.StatusOK, kbView{Info: info, Shared: kb.IsShared()})
}

// listKBs names the kbs the caller may name: its tenant's own and the
// shared ones ("kbs"), and which of them are shared ("shared").
func (s *Server) listKBs(c echo.Context) error {
	who, err := s.authenticateFor(c, config.RouteReads)
	if err != nil {
		return err
	}
	if s.kbStore == nil {
		return unavailable("knowledge bases are not configured in this process")
	}
	names, err := s.readableKBs(c.Request().Context(), who)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"kbs": names, "shared": s.sharedKBs()})
}

// readableKBs are the names of the kbs who may ask, sorted: the shared
// ones and its tenant's own (none in a process without a kb store).
func (s *Server) readableKBs(ctx context.Context, who caller) ([]string, error) {
	if s.kbStore == nil {
		return s.sharedKBs(), nil
	}
	own, err := s.kbStore.KBs(ctx, who.Tenant)
	if err != nil {
		s.logger.Error("list kbs", "tenant", who.Tenant, "err", err)
		return nil, unavailable("could not list knowledge bases; please retry")
	}
	names := append([]string{}, s.sharedKBs()...)
	for _, name := range own {
		// A tenant's kb whose name the operator since declared shared
		// is out of its reach.
		if !s.isSharedKB(name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// checkKBName refuses a kb name that cannot name a kb.
func checkKBName(kb string) error {
	if !kbref.ValidName(kb) {
		return badRequest("bad_kb", "knowledge base names are %s", kbref.NameRule)
	}
	return nil
}

// isSharedKB reports whether the operator declared name shared. s.kbs
// holds the configured kbs by key, and a bare name is the key of a
// shared kb only.
func (s *Server) isSharedKB(name string) bool { return s.kbs[kbref.Shared(name).Key()] }

// sharedKBs are the shared kbs' names, sorted.
func (s *Server) sharedKBs() []string {
	var out []string
	for _, kb := range s.cfg.Retrieval.KnowledgeBases {
		if kb.Shared {
			out = append(out, kb.Name)
		}
	}
	slices.Sort(out)
	return out
}

// resolveKB is the kb a caller means by name: the shared kb of that
// name if there is one, else its tenant's own. So a name means one kb to
// a tenant whatever other tenants call theirs, and another tenant's kb
// cannot be named at all.
func (s *Server) resolveKB(who caller, name string) kbref.Ref {
	if s.isSharedKB(name) {
		return kbref.Shared(name)
	}
	return kbref.Own(who.Tenant, name)
}

// resolveChatKB resolves a chat request's kb for its caller once, at the
// door, and records the owner in the request for its workflow input.
func (s *Server) resolveChatKB(who caller, req *chatRequest) kbref.Ref {
	kb := s.resolveKB(who, req.KB)
	req.kbTenant = kb.Tenant
	return kb
}

// kbRef is the request's kb as the door resolved it.
func (req *chatRequest) kbRef() kbref.Ref { return kbref.Ref{Tenant: req.kbTenant, Name: req.KB} }

// writableKB is the kb a write names, if the caller may change it: its
// key holds the ingest scope and the kb is its tenant's own. A shared kb
// is anyone's to read, so refusing a write to it (403) reveals nothing;
// another tenant's kb cannot be named (the name is the caller's own kb).
func (s *Server) writableKB(who caller, name string) (kbref.Ref, error) {
	if err := checkKBName(name); err != nil {
		return kbref.Ref{}, err
	}
	if err := who.needs(keys.ScopeIngest, "change knowledge bases"); err != nil {
		return kbref.Ref{}, err
	}
	kb := s.resolveKB(who, name)
	if kb.IsShared() {
		return kbref.Ref{}, &apiError{Status: http.StatusForbidden, Code: "kb_read_only",
			Message: "knowledge base " + name + " is shared: every tenant may read it, none may change it"}
	}
	return kb, nil
}

// kbKnown reports whether a chat request may name kb. A kb, once
// written, is never removed (only its documents are), so a yes is
// remembered: a flood naming a real kb costs Redis nothing here.
func (s *Server) kbKnown(ctx context.Context, kb kbref.Ref) (bool, error) {
	key := kb.Key()
	if s.kbStore == nil || s.kbs[key] || kb.IsShared() {
		// A configured kb is known even while Redis lacks it (it
		// restarted empty): the workers seed it again. Every shared kb
		// is a configured one.
		return s.kbs[key], nil
	}
	if _, ok := s.seenKBs.Load(key); ok {
		return true, nil
	}
	if !kbref.ValidName(kb.Name) {
		return false, nil
	}
	v, err := s.kbStore.Version(ctx, key)
	if v > 0 {
		s.seenKBs.Store(key, struct{}{})
	}
	return v > 0, err
}
