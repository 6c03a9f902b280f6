package openai

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/files"
	"github.com/sluice-dev/sluice/pkg/keys"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// filesPath is OpenAI's Files API: here, the JSONL inputs of batches
// (purpose batch), checked line by line as they are uploaded, and the
// batches' output files.
const filesPath = "/v1/files"

// PurposeBatch is the one purpose a client uploads files for.
const PurposeBatch = "batch"

// fileObject is OpenAI's File.
type fileObject struct {
	ID            string  `json:"id"`
	Object        string  `json:"object"`
	Bytes         int64   `json:"bytes"`
	CreatedAt     int64   `json:"created_at"`
	ExpiresAt     *int64  `json:"expires_at"`
	Filename      string  `json:"filename"`
	Purpose       string  `json:"purpose"`
	Status        string  `json:"status"`
	StatusDetails *string `json:"status_details"`
}

func fileObjectOf(f files.File) fileObject {
	o := fileObject{ID: f.ID, Object: "file", Bytes: f.Bytes, CreatedAt: f.CreatedAt.Unix(), Filename: f.Filename,
		Purpose: f.Purpose, Status: "processed"}
	if !f.ExpiresAt.IsZero() {
		at := f.ExpiresAt.Unix()
		o.ExpiresAt = &at
	}
	return o
}

// filesOff is the answer of every file route with files.store off.
func filesOff() error {
	return &refusal.Error{Class: refusal.NotFound, Code: "not_found",
		Message: "files are not kept here (files.store is off)"}
}

// fileOf is the caller's file the path names, the caller charged to
// route's limits.
func (s *Server) fileOf(c echo.Context, route string) (door.Caller, files.File, error) {
	who, err := s.auth.For(c, route)
	if err != nil {
		return who, files.File{}, err
	}
	if s.files == nil {
		return who, files.File{}, filesOff()
	}
	id := c.Param("id")
	f, err := s.files.Get(c.Request().Context(), who.Tenant, id)
	if errors.Is(err, files.ErrNotFound) {
		return who, f, &refusal.Error{Class: refusal.NotFound, Code: "not_found", Message: fmt.Sprintf("no file %q", id)}
	}
	return who, f, err
}

// getFile answers GET /v1/files/{id}.
func (s *Server) getFile(c echo.Context) error {
	_, f, err := s.fileOf(c, policy.RouteReads)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, fileObjectOf(f))
}

// fileContent answers GET /v1/files/{id}/content: the file as it was
// uploaded, streamed a chunk at a time.
func (s *Server) fileContent(c echo.Context) error {
	who, f, err := s.fileOf(c, policy.RouteReads)
	if err != nil {
		return err
	}
	r, err := s.files.Open(c.Request().Context(), who.Tenant, f.ID)
	if err != nil {
		return err
	}
	defer r.Close()
	c.Response().Header().Set(echo.HeaderContentLength, strconv.FormatInt(f.Bytes, 10))
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMEOctetStream) // as OpenAI serves it
	c.Response().WriteHeader(http.StatusOK)
	if _, err := io.Copy(c.Response(), r); err != nil {
		// The status is sent: the client sees a body shorter than its
		// Content-Length.
		s.logger.Warn("send a file's content", "file", f.ID, "err", err)
	}
	return nil
}

// deleteFile answers DELETE /v1/files/{id}.
func (s *Server) deleteFile(c echo.Context) error {
	who, f, err := s.fileOf(c, policy.RouteReads)
	if err != nil {
		return err
	}
	if _, err := s.files.Delete(c.Request().Context(), who.Tenant, f.ID); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"id": f.ID, "object": "file", "deleted": true})
}

// A page of files, as OpenAI's.
const (
	defaultFilesPage = 10000
	maxFilesPage     = 10000
)

// listFiles answers GET /v1/files: the caller's tenant's files, newest
// first unless ?order=asc, ?limit= (1–10000) a page, after ?after=, of
// ?purpose= if given.
func (s *Server) listFiles(c echo.Context) error {
	who, err := s.auth.For(c, policy.RouteReads)
	if err != nil {
		return err
	}
	if s.files == nil {
		return filesOff()
	}
	p := files.Page{Purpose: c.QueryParam("purpose"), After: c.QueryParam("after"), Limit: defaultFilesPage}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxFilesPage {
			return paramError("limit", "invalid_value", "limit must be between 1 and %d, got %q", maxFilesPage, v)
		}
		p.Limit = n
	}
	switch order := cmp.Or(c.QueryParam("order"), "desc"); order {
	case "asc":
		p.Asc = true
	case "desc":
	default:
		return paramError("order", "invalid_value", "order must be asc or desc, got %q", order)
	}
	list, more, err := s.files.List(c.Request().Context(), who.Tenant, p)
	if err != nil {
		return err
	}
	data := make([]fileObject, len(list))
	for i, f := range list {
		data[i] = fileObjectOf(f)
	}
	page := map[string]any{"object": "list", "data": data, "has_more": more, "first_id": nil, "last_id": nil}
	if len(data) > 0 {
		page["first_id"], page["last_id"] = data[0].ID, data[len(data)-1].ID
	}
	return c.JSON(http.StatusOK, page)
}

// needsChat refuses a caller whose key may not ask for answers: a batch's
// file is a batch of requests.
func needsChat(who door.Caller) error {
	return who.Needs(keys.ScopeChat, "upload a batch's requests")
}

// batchFileLife is how long a batch's file is kept without
// expires_after: 30 days, as at OpenAI.
const batchFileLife = 30 * 24 * time.Hour

// expiry is when a file uploaded now with expires_after (anchor
// created_at, seconds from an hour to 30 days, as OpenAI's) expires.
func expiry(anchor, seconds string, now time.Time) (time.Time, error) {
	if anchor == "" && seconds == "" {
		return now.Add(batchFileLife), nil
	}
	if anchor != "created_at" {
		return time.Time{}, paramError("expires_after.anchor", "invalid_value", "expires_after[anchor] must be created_at, got %q", anchor)
	}
	n, err := strconv.Atoi(seconds)
	if err != nil || n < 3600 || n > int(batchFileLife/time.Second) {
		return time.Time{}, paramError("expires_after.seconds", "invalid_value",
			"expires_after[seconds] must be between 3600 (an hour) and 2592000 (30 days), got %q", seconds)
	}
	return now.Add(time.Duration(n) * time.Second), nil
}
