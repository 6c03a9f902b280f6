// Package batchfile checks a batch's input file as it is uploaded: each
// line a request ({custom_id, method, url, body}) for one of the
// endpoints a batch may run, every custom_id once, every line for the
// same url, and each body one its endpoint would take. The whole file is
// read before it is judged, so that its author learns of every bad line
// at once (the first MaxErrors of them, and how many there were).
package batchfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// The endpoints a batch's lines may call, as OpenAI's batches allow.
const (
	ChatCompletions = "/v1/chat/completions"
	Responses       = "/v1/responses"
	Embeddings      = "/v1/embeddings"
)

// Endpoints are the urls a line may name.
var Endpoints = []string{ChatCompletions, Responses, Embeddings}

// MaxErrors is how many bad lines a check reports; it counts them all.
const MaxErrors = 100

// Line is one request of a batch's input.
type Line struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// LineError is what is wrong with one line, as OpenAI reports a batch
// file's errors: the line (from 1), a code, a message and the field.
type LineError struct {
	Line    int     `json:"line"`
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
}

// BodyCheck checks a line's body for its endpoint, as that endpoint
// would: nil, or the error a request with that body would get, which
// Check reports as the line's (a *CheckError names its code and param).
type BodyCheck func(url string, body []byte) error

// CheckError is a body's refusal, with the code and field to report.
type CheckError struct {
	Code, Param, Message string
}

func (e *CheckError) Error() string { return e.Message }

// Checker judges a file's lines one at a time.
type Checker struct {
	body BodyCheck
	// maxBody bounds one line's body, as the endpoint bounds a request's.
	maxBody int
	ids     map[string]int
	url     string
	lines   int
	bad     int
	errs    []LineError
}

// NewChecker checks lines with body, each body at most maxBody bytes.
func NewChecker(body BodyCheck, maxBody int) *Checker {
	return &Checker{body: body, maxBody: maxBody, ids: map[string]int{}}
}

// Line checks the next line, as read (its end of line included). A blank
// line is refused, as OpenAI refuses it.
func (c *Checker) Line(raw []byte) {
	c.lines++
	if err := c.check(bytes.TrimSpace(raw)); err != nil {
		c.add(err)
	}
}

// TooLong counts the next line as one longer than the reader takes
// (which read none of it).
func (c *Checker) TooLong(limit int) {
	c.lines++
	c.add(bad("line_too_long", "", "the line is longer than %d bytes", limit))
}

func (c *Checker) add(err *LineError) {
	c.bad++
	if len(c.errs) < MaxErrors {
		err.Line = c.lines
		c.errs = append(c.errs, *err)
	}
}

func (c *Checker) check(raw []byte) *LineError {
	if len(raw) == 0 {
		return bad("empty_line", "", "the line is empty: each line is one request")
	}
	var l Line
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return bad("invalid_json", "", "the line is not a request object {custom_id, method, url, body}: %v", err)
	}
	if dec.More() {
		return bad("invalid_json", "", "the line holds more than one JSON value")
	}
	switch {
	case l.CustomID == "":
		return bad("missing_required_parameter", "custom_id", "custom_id must be a non-empty string")
	case l.Method != "POST":
		return bad("invalid_value", "method", "method must be POST, got %q", l.Method)
	case !slices.Contains(Endpoints, l.URL):
		return bad("invalid_value", "url", "url must be one of %v, got %q", Endpoints, l.URL)
	case len(bytes.TrimSpace(l.Body)) == 0 || bytes.TrimSpace(l.Body)[0] != '{':
		return bad("invalid_value", "body", "body must be a JSON object, the request to %s", l.URL)
	case len(l.Body) > c.maxBody:
		return bad("body_too_large", "body", "body exceeds %d bytes", c.maxBody)
	}
	if first, ok := c.ids[l.CustomID]; ok {
		return bad("duplicate_custom_id", "custom_id", "custom_id %q is also line %d's: each line's must be its own", l.CustomID, first)
	}
	c.ids[l.CustomID] = c.lines
	if c.url == "" {
		c.url = l.URL
	} else if l.URL != c.url {
		return bad("mismatched_url", "url", "every line of a batch calls one endpoint: this one %s, the first %s", l.URL, c.url)
	}
	if err := c.body(l.URL, l.Body); err != nil {
		var ce *CheckError
		if errors.As(err, &ce) {
			e := bad(ce.Code, ce.Param, "%s", ce.Message)
			if ce.Param != "" {
				p := "body." + ce.Param
				e.Param = &p
			}
			return e
		}
		return bad("invalid_request", "body", "%v", err)
	}
	return nil
}

func bad(code, param, format string, args ...any) *LineError {
	e := &LineError{Code: code, Message: fmt.Sprintf(format, args...)}
	if param != "" {
		e.Param = &param
	}
	return e
}

// Report is a checked file's verdict.
type Report struct {
	// Lines and Bad count the file's lines and its bad ones.
	Lines, Bad int
	// Errors are the first MaxErrors bad lines.
	Errors []LineError
	// URL is the endpoint every line calls ("" when the file has no
	// good line).
	URL string
}

// Bad is how many of the lines checked so far are bad.
func (c *Checker) Bad() int { return c.bad }

// Report is the verdict on the lines checked so far.
func (c *Checker) Report() Report {
	return Report{Lines: c.lines, Bad: c.bad, Errors: slices.Clone(c.errs), URL: c.url}
}
