package chatclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// Send makes one chat request to the API at baseURL and reads its stream
// to the end, checking the stream's promises as it goes.
func Send(ctx context.Context, hc *http.Client, baseURL string, q Request) *Result {
	q = q.withDefaults()
	r := &Result{Start: time.Now()}
	ctx, cancel := context.WithTimeout(ctx, q.Bound)
	defer cancel()
	var left atomic.Bool
	if q.LeaveAfter > 0 {
		var leave context.CancelFunc
		ctx, leave = context.WithCancel(ctx)
		defer leave()
		t := time.AfterFunc(q.LeaveAfter, func() { left.Store(true); leave() })
		defer t.Stop()
	}
	if body, err := r.Post(ctx, hc, baseURL, q); err == nil {
		r.Read(body, -1)
		body.Close()
	}
	r.Took = time.Since(r.Start)
	// A client that left before its end left; one that had its end (a
	// refusal, or the terminal event) first did not.
	r.Left = left.Load() && r.Terminal == "" && (r.Status == http.StatusOK || r.Status == 0)
	if r.Left {
		r.Err = nil
	}
	if !r.Left && r.Terminal == "" && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		r.Hung = true
	}
	return r
}

// Post sends the chat request and returns the open stream of a 200; a
// refusal is recorded in r and returned as an error, and so is a failed
// connection (in r.Err too).
func (r *Result) Post(ctx context.Context, hc *http.Client, baseURL string, q Request) (io.ReadCloser, error) {
	q = q.withDefaults()
	r.Key = q.Key
	fields := map[string]any{"query": q.Query, "max_tokens": q.MaxTokens}
	if q.ServiceTier != "" {
		fields["service_tier"] = q.ServiceTier
	}
	body, err := json.Marshal(fields)
	if err != nil {
		r.Err = fmt.Errorf("encode chat request: %w", err)
		return nil, r.Err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/chat", strings.NewReader(string(body)))
	if err != nil {
		r.Err = err
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+q.Key)
	resp, err := hc.Do(req)
	if err != nil {
		r.Err = err
		return nil, err
	}
	r.Status, r.ID = resp.StatusCode, resp.Header.Get("X-Request-ID")
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		r.RetryAfter = resp.Header.Get("Retry-After")
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		raw, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(raw, &e)
		r.Code = e.Error.Code
		return nil, fmt.Errorf("chat refused: %d %s", r.Status, r.Code)
	}
	return resp.Body, nil
}

// Resume reconnects to the request's events at the API at baseURL after
// r.LastID (the Last-Event-ID header) and returns the open stream.
func (r *Result) Resume(ctx context.Context, hc *http.Client, baseURL string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/v1/requests/"+r.ID+"/events", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+r.Key)
	req.Header.Set("Last-Event-ID", r.LastID)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("resume %s: %w", r.ID, err)
	}
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("resume %s: %d %s", r.ID, resp.StatusCode, raw)
	}
	return resp.Body, nil
}

// Read reads events until the stream ends, or until it has brought
// maxTokens tokens in all (-1: no limit), recording the end and every
// broken promise. A connection error is kept in r.Err unless the
// terminal event came first.
func (r *Result) Read(body io.Reader, maxTokens int) {
	sse := testenv.NewSSEReader(body)
	for maxTokens < 0 || r.Tokens < maxTokens {
		ev, err := sse.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) && r.Terminal == "" {
				r.Err = err
			}
			return
		}
		if ev.ID != "" {
			r.LastID = ev.ID
		}
		if r.Terminal != "" {
			r.Violations = append(r.Violations, fmt.Sprintf("%s event after the terminal %s", ev.Event, r.Terminal))
			continue
		}
		switch {
		case ev.Event == events.TypeToken:
			r.readToken(ev)
		case events.Terminal(ev.Event):
			r.readEnd(ev)
		}
	}
}

// readToken counts a token, which must be the next in order.
func (r *Result) readToken(ev testenv.SSEEvent) {
	var tok events.Token
	if err := ev.Decode(&tok); err != nil || tok.Index != r.Tokens {
		r.Violations = append(r.Violations, fmt.Sprintf("token with index %d after %d tokens (text repeated or lost)", tok.Index, r.Tokens))
	}
	if r.Tokens == 0 && !r.Start.IsZero() {
		r.TTFT = time.Since(r.Start)
	}
	now := time.Now()
	if r.Tokens > 0 && !r.lastToken.IsZero() {
		r.MaxGap = max(r.MaxGap, now.Sub(r.lastToken))
	}
	r.lastToken = now
	r.text.WriteString(tok.Text)
	r.Tokens++
}

// readEnd records the terminal event and what it says.
func (r *Result) readEnd(ev testenv.SSEEvent) {
	r.Terminal = ev.Event
	if ev.Event == events.TypeDone {
		var d events.Done
		if ev.Decode(&d) == nil {
			r.Finish, r.Completion, r.Pauses = d.FinishReason, d.Usage.CompletionTokens, d.Pauses
		}
		return
	}
	var f events.Failure
	if ev.Decode(&f) == nil {
		r.Reason, r.RetryAfterS = f.Reason, f.RetryAfterS
	}
}
