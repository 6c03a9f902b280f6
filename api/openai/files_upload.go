package openai

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/batchfile"
	"github.com/sluice-dev/sluice/pkg/files"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// lineEnvelope is what a batch line may hold besides its body: custom_id,
// method, url and JSON's punctuation.
const lineEnvelope = 64 << 10

// fieldBytes bounds a form field other than the file.
const fieldBytes = 256

// postFile answers POST /v1/files: a batch's JSONL input, as OpenAI's
// clients send it (multipart: purpose, file and expires_after[anchor],
// expires_after[seconds], in any order). The file is read a line at a
// time, each line checked and stored as it comes, in one transaction: a
// file with a bad line, too large, or past its tenant's quota leaves
// nothing stored, and its author learns of every bad line at once (the
// first 100, with their line numbers, and how many there were).
func (s *Server) postFile(c echo.Context) error {
	who, err := s.auth.For(c, policy.RouteIngest)
	if err != nil {
		return err
	}
	if err := needsChat(who); err != nil {
		return err
	}
	if s.files == nil {
		return filesOff()
	}
	// The upload's own deadline, in place of api.body_read_timeout.
	_ = http.NewResponseController(c.Response()).SetReadDeadline(time.Now().Add(s.cfg.Files.UploadTimeout))
	mr, err := c.Request().MultipartReader()
	if err != nil {
		return &refusal.Error{Class: refusal.UnsupportedMedia, Code: "unsupported_media_type",
			Message: "a file is uploaded as multipart/form-data (purpose, file), as OpenAI's clients send it"}
	}
	ctx := c.Request().Context()
	up := &upload{s: s, who: who, quota: s.door.FileQuota(who), fields: map[string]string{}}
	defer up.abort()
	if err := up.checkQuota(ctx); err != nil {
		return err
	}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return refusal.BadRequest("bad_multipart", "read the upload: %v", err)
		}
		if err := up.part(ctx, part); err != nil {
			return err
		}
	}
	return up.finish(c)
}

// upload is one POST /v1/files as it is read.
type upload struct {
	s   *Server
	who door.Caller
	// quota is the tenant's file quota (0: none), of which used is kept
	// already.
	quota, used int64
	fields      map[string]string
	w           *files.Writer
	check       *batchfile.Checker
}

func (up *upload) checkQuota(ctx context.Context) error {
	if up.quota == 0 {
		return nil
	}
	used, err := up.s.files.Used(ctx, up.who.Tenant)
	if err != nil {
		return err
	}
	up.used = used
	return up.overQuota(0)
}

// overQuota refuses an upload of n bytes so far that would take its
// tenant past its quota.
func (up *upload) overQuota(n int64) error {
	if up.quota == 0 || up.used+n <= up.quota && up.used < up.quota {
		return nil
	}
	return &refusal.Error{Class: refusal.TooLarge, Code: "storage_quota_exceeded", Param: "file",
		Message: fmt.Sprintf("your organisation's files would hold more than its plan's %d bytes (%d kept already): delete files or ask for a larger plan", up.quota, up.used)}
}

// part reads one part of the form.
func (up *upload) part(ctx context.Context, p *multipart.Part) error {
	name := p.FormName()
	switch name {
	case "file":
		if up.w != nil {
			return paramError("file", "invalid_value", "an upload carries one file")
		}
		return up.file(ctx, p)
	case "purpose", "expires_after[anchor]", "expires_after[seconds]":
		v, err := io.ReadAll(io.LimitReader(p, fieldBytes+1))
		if err != nil {
			return refusal.BadRequest("bad_multipart", "read the upload's %s: %v", name, err)
		}
		if len(v) > fieldBytes {
			return paramError(name, "invalid_value", "%s is longer than %d bytes", name, fieldBytes)
		}
		up.fields[name] = string(v)
		return nil
	}
	return paramError(name, "unknown_parameter", "unknown field %q: an upload has purpose, file and expires_after", name)
}

// file reads the file a line at a time: each line is counted against the
// file's bounds and the tenant's quota, checked as a batch's request, and
// stored while every line so far is good.
func (up *upload) file(ctx context.Context, p *multipart.Part) error {
	cfg := up.s.cfg
	w, err := up.s.files.Create(ctx, "file-"+door.NewULID(), up.who.Tenant, p.FileName())
	if err != nil {
		return err
	}
	up.w = w
	up.check = batchfile.NewChecker(up.s.checkBatchBody, int(cfg.API.MaxBodyBytes))
	maxLine := int(cfg.API.MaxBodyBytes) + lineEnvelope
	r := bufio.NewReaderSize(p, 64<<10)
	var total int64
	var buf []byte
	for lines := 1; ; lines++ {
		line, n, tooLong, err := readLine(r, buf[:0], maxLine)
		buf = line
		if n == 0 && errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return refusal.BadRequest("bad_body", "read the file: %v", err)
		}
		total += int64(n)
		switch {
		case total > cfg.Files.MaxBytes:
			return &refusal.Error{Class: refusal.TooLarge, Code: "file_too_large", Param: "file",
				Message: fmt.Sprintf("the file is larger than %d bytes (files.max_bytes)", cfg.Files.MaxBytes)}
		case lines > cfg.Files.MaxLines:
			return paramError("file", "too_many_lines", "the file has more than %d lines (files.max_lines): split it into several batches", cfg.Files.MaxLines)
		}
		if err := up.overQuota(total); err != nil {
			return err
		}
		if tooLong {
			up.check.TooLong(maxLine)
		} else {
			up.check.Line(line)
		}
		if up.check.Bad() == 0 {
			if err := w.Line(line); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
	}
}

// readLine reads the next line into buf (its end of line included), at
// most max bytes of it: a longer one is read to its end, reported too
// long and not kept. n is the bytes read; err is io.EOF at the end.
func readLine(r *bufio.Reader, buf []byte, max int) (line []byte, n int, tooLong bool, err error) {
	for {
		frag, err := r.ReadSlice('\n')
		n += len(frag)
		if !tooLong {
			if len(buf)+len(frag) > max {
				tooLong, buf = true, buf[:0]
			} else {
				buf = append(buf, frag...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return buf, n, tooLong, err
	}
}

// finish judges the upload once it was read whole, and stores it.
func (up *upload) finish(c echo.Context) error {
	purpose := up.fields["purpose"]
	switch {
	case purpose == "":
		return paramError("purpose", "missing_required_parameter", "purpose is required: batch")
	case purpose != PurposeBatch:
		return paramError("purpose", "unsupported_value", "purpose must be batch, got %q: files here are batches' inputs", purpose)
	case up.w == nil:
		return paramError("file", "missing_required_parameter", "file is required")
	}
	now := time.Now()
	expires, err := expiry(up.fields["expires_after[anchor]"], up.fields["expires_after[seconds]"], now)
	if err != nil {
		return err
	}
	rep := up.check.Report()
	switch {
	case rep.Lines == 0:
		return paramError("file", "empty_file", "the file has no line: each line is one request")
	case rep.Bad > 0:
		return invalidFile(c, rep)
	}
	f, err := up.w.Commit(files.Meta{Purpose: purpose, Endpoint: rep.URL, CreatedAt: now, ExpiresAt: expires})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, fileObjectOf(f))
}

// abort drops an upload that was not stored.
func (up *upload) abort() {
	if up.w != nil {
		up.w.Abort()
	}
}

// invalidFileError is the answer to a file with bad lines: OpenAI's error,
// with every bad line's number, code and message (the first 100) and how
// many there were.
type invalidFileError struct {
	openai.Error
	Lines    int             `json:"lines"`
	BadLines int             `json:"bad_lines"`
	Errors   lineErrorsTable `json:"errors"`
}

type lineErrorsTable struct {
	Object string                `json:"object"`
	Data   []batchfile.LineError `json:"data"`
}

func invalidFile(c echo.Context, rep batchfile.Report) error {
	first := rep.Errors[0]
	e := paramError("file", "invalid_file", "%d of the file's %d lines are not requests a batch can run; the first, line %d: %s",
		rep.Bad, rep.Lines, first.Line, first.Message)
	body := invalidFileError{Error: ErrorBody(e).Error, Lines: rep.Lines, BadLines: rep.Bad,
		Errors: lineErrorsTable{Object: "list", Data: rep.Errors}}
	return c.JSON(http.StatusBadRequest, map[string]any{"error": body})
}
