package openai

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/answer"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/responses"
)

// Stored responses: a response is stored unless the request says store:
// false (as at OpenAI), when responses.store is on. The API writes what
// was asked once the door admitted it; the chat workflow writes the
// answer when the request ends (activities.StoreResponse), read from its
// event log. Until then, a read tells the response as its log stands.

// storing reports whether rr's response is stored, refusing what asks for
// a store this process has not.
func (s *Server) storing(rr responseRequest) (bool, error) {
	if rr.Background && rr.Store != nil && !*rr.Store {
		// Its answer is read back by its id: it must be kept.
		return false, paramError("store", "invalid_value", "a background response is stored: send store: true, or leave store out")
	}
	if s.responses != nil {
		return rr.Store == nil || *rr.Store, nil
	}
	if rr.Background {
		return false, paramError("background", "storage_disabled",
			"responses are not stored here (responses.store is off), so none can run in the background: its answer could not be read back")
	}
	if rr.Store != nil && *rr.Store {
		return false, paramError("store", "storage_disabled", "responses are not stored here (responses.store is off): send store: false")
	}
	if rr.PreviousResponseID != "" {
		return false, paramError("previous_response_id", "storage_disabled",
			"responses are not stored here (responses.store is off), so none can be continued")
	}
	return false, nil
}

// priorItems is the conversation previous (tenant's stored response)
// continues, as input items: each response of its chain, oldest first,
// its input items then its output. Instructions are not carried on, as
// at OpenAI.
func (s *Server) priorItems(ctx context.Context, tenant, previous string) ([]json.RawMessage, error) {
	if previous == "" {
		return nil, nil
	}
	chain, err := s.responses.Chain(ctx, tenant, previous, s.cfg.Responses.MaxChain)
	switch {
	case errors.Is(err, responses.ErrNotFound):
		return nil, &refusal.Error{Class: refusal.NotFound, Code: "not_found", Param: "previous_response_id",
			Message: fmt.Sprintf("no stored response %q", previous)}
	case errors.Is(err, responses.ErrChainTooLong):
		return nil, paramError("previous_response_id", "invalid_value",
			"previous_response_id reaches back through more than %d responses (responses.max_chain)", s.cfg.Responses.MaxChain)
	case err != nil:
		return nil, fmt.Errorf("read the responses %s continues: %w", previous, err)
	}
	var items []json.RawMessage
	for _, rec := range chain {
		var in []json.RawMessage
		if err := json.Unmarshal(rec.Input, &in); err != nil {
			return nil, fmt.Errorf("read the input of stored response %s: %w", rec.ID, err)
		}
		resp, ended, err := s.responseOf(ctx, rec)
		if err != nil {
			return nil, err
		}
		if !ended {
			return nil, paramError("previous_response_id", "response_in_progress",
				"response %s has not ended yet: continue it once it has", rec.ID)
		}
		var out struct {
			Output []json.RawMessage `json:"output"`
		}
		if err := json.Unmarshal(resp, &out); err != nil {
			return nil, fmt.Errorf("read the output of stored response %s: %w", rec.ID, err)
		}
		items = append(append(items, in...), out.Output...)
	}
	return items, nil
}

// store writes what response id of who asked, once the door admitted it.
// A failure is logged: the answer is still given, and the workflow still
// stores it.
func (s *Server) store(ctx context.Context, who door.Caller, id string, rr responseRequest, base openai.Response) {
	items, err := inputItems(rr.Input)
	if err == nil {
		var input, params []byte
		input, err = json.Marshal(items)
		if err == nil {
			params, err = json.Marshal(base)
		}
		if err == nil {
			err = s.responses.Create(ctx, responses.Record{ID: id, Tenant: who.Tenant, User: who.User, Status: openai.ResponseQueued,
				Params: params, Input: input, PreviousID: rr.PreviousResponseID, CreatedAt: time.Now()})
		}
	}
	if err != nil {
		s.logger.Warn("store what a response asked; its answer is still stored", "response", id, "err", err)
	}
}

// responseOf is rec's Response: as stored once it ended, else as its
// event log tells it (a response read right after its end, before its
// workflow stored it, is whole there too).
func (s *Server) responseOf(ctx context.Context, rec responses.Record) (json.RawMessage, bool, error) {
	if rec.Ended() {
		return rec.Response, true, nil
	}
	base, err := paramsOf(rec)
	if err != nil {
		return nil, false, err
	}
	requestID, _ := answer.RequestID(rec.ID)
	enc, err := answer.ReadResponse(ctx, s.events, requestID, base)
	if err != nil {
		return nil, false, err
	}
	raw, err := json.Marshal(enc.Response())
	if err != nil {
		return nil, false, fmt.Errorf("encode response %s: %w", rec.ID, err)
	}
	return raw, enc.Ended(), nil
}

// paramsOf is the Response rec asked for, before any output.
func paramsOf(rec responses.Record) (openai.Response, error) {
	var base openai.Response
	if err := json.Unmarshal(rec.Params, &base); err != nil {
		return base, fmt.Errorf("read the parameters of stored response %s: %w", rec.ID, err)
	}
	return base, nil
}

// storedRecord is the caller's stored response the path names, the
// caller charged to route's limits.
func (s *Server) storedRecord(c echo.Context, route string) (door.Caller, responses.Record, error) {
	who, err := s.auth.For(c, route)
	if err != nil {
		return who, responses.Record{}, err
	}
	id := c.Param("id")
	if s.responses == nil {
		return who, responses.Record{}, &refusal.Error{Class: refusal.NotFound, Code: "not_found",
			Message: fmt.Sprintf("no stored response %q: responses are not stored here (responses.store is off)", id)}
	}
	rec, err := s.responses.Get(c.Request().Context(), who.Tenant, id)
	if errors.Is(err, responses.ErrNotFound) {
		return who, rec, &refusal.Error{Class: refusal.NotFound, Code: "not_found", Message: fmt.Sprintf("no stored response %q", id)}
	}
	return who, rec, err
}

// getResponse answers GET /v1/responses/{id}: the caller's tenant's
// stored response, whole once it ended, as it stands before; with
// ?stream=true, its events again (streamAgain).
func (s *Server) getResponse(c echo.Context) error {
	stream, from, badQuery := streamQuery(c)
	route := policy.RouteReads
	if stream {
		route = policy.RouteResumes
	}
	// The caller first: a stranger hears 401, not what its query lacks.
	_, rec, err := s.storedRecord(c, route)
	if err != nil {
		return err
	}
	if badQuery != nil {
		return badQuery
	}
	if stream {
		return s.streamAgain(c, rec, from)
	}
	raw, _, err := s.responseOf(c.Request().Context(), rec)
	if err != nil {
		return err
	}
	return c.JSONBlob(http.StatusOK, raw)
}

// deleteResponse answers DELETE /v1/responses/{id}: the stored response
// is gone, for reads and for previous_response_id; one still running is
// cancelled first, so that nothing runs on for a response nobody can
// read.
func (s *Server) deleteResponse(c echo.Context) error {
	who, rec, err := s.storedRecord(c, policy.RouteReads)
	if err != nil {
		return err
	}
	if err := s.stopRunning(c.Request().Context(), rec); err != nil {
		return err
	}
	if _, err := s.responses.Delete(c.Request().Context(), who.Tenant, rec.ID); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"id": rec.ID, "object": "response.deleted", "deleted": true})
}

// A page of input items, as OpenAI's.
const (
	defaultItemsPage = 20
	maxItemsPage     = 100
)

// listInputItems answers GET /v1/responses/{id}/input_items: the stored
// response's own input items (not those of the responses it continues),
// a page at a time by item id (?after=, ?limit= 1–100, default 20;
// ?order= asc or desc, the default, as at OpenAI). An item sent without
// an id is given one from its response's and its place.
func (s *Server) listInputItems(c echo.Context) error {
	// The caller first: a stranger hears 401, not what its query lacks.
	_, rec, err := s.storedRecord(c, policy.RouteReads)
	if err != nil {
		return err
	}
	limit := defaultItemsPage
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxItemsPage {
			return paramError("limit", "invalid_value", "limit must be between 1 and %d, got %q", maxItemsPage, v)
		}
		limit = n
	}
	order := cmp.Or(c.QueryParam("order"), "desc")
	if order != "asc" && order != "desc" {
		return paramError("order", "invalid_value", "order must be asc or desc, got %q", order)
	}
	items, err := itemsWithIDs(rec)
	if err != nil {
		return err
	}
	if order == "desc" {
		slices.Reverse(items)
	}
	if after := c.QueryParam("after"); after != "" {
		i := slices.IndexFunc(items, func(it map[string]any) bool { return it["id"] == after })
		if i < 0 {
			return paramError("after", "invalid_value", "no input item %q in response %s", after, rec.ID)
		}
		items = items[i+1:]
	}
	page := map[string]any{"object": openai.ObjectList, "data": items[:min(limit, len(items))], "has_more": len(items) > limit,
		"first_id": nil, "last_id": nil}
	if n := min(limit, len(items)); n > 0 {
		page["first_id"], page["last_id"] = items[0]["id"], items[n-1]["id"]
	}
	return c.JSON(http.StatusOK, page)
}

// itemsWithIDs is rec's input items, each with its id.
func itemsWithIDs(rec responses.Record) ([]map[string]any, error) {
	var items []map[string]any
	if err := json.Unmarshal(rec.Input, &items); err != nil {
		return nil, fmt.Errorf("read the input of stored response %s: %w", rec.ID, err)
	}
	ulid := strings.TrimPrefix(rec.ID, answer.ResponseIDPrefix)
	for i, it := range items {
		if id, _ := it["id"].(string); id == "" {
			it["id"] = fmt.Sprintf("in_%s_%d", ulid, i)
		}
		asMessageItem(it)
	}
	return items, nil
}

// asMessageItem writes a message sent in the short form (a role and a
// string) as OpenAI lists it: a message item whose content is one text
// part.
func asMessageItem(it map[string]any) {
	role, _ := it["role"].(string)
	if typ, _ := it["type"].(string); role == "" || typ != "" && typ != openai.ItemMessage {
		return
	}
	it["type"] = openai.ItemMessage
	if _, ok := it["status"]; !ok {
		it["status"] = openai.ResponseCompleted
	}
	if text, ok := it["content"].(string); ok {
		part := openai.PartInputText
		if role == openai.RoleAssistant {
			part = openai.PartOutputText
		}
		it["content"] = []map[string]any{{"type": part, "text": text}}
	}
}
