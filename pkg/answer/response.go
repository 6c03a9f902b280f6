package answer

import (
	"cmp"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
)

// ResponseEncoder tells a request's events as the Responses API's: the
// Response as it stands, and the numbered events of its stream. It reads
// nothing but the events and the request's parameters, so two readers of
// one request's log number its events alike.
type ResponseEncoder struct {
	resp openai.Response
	// ulid is the request id's ULID, which the item ids are made of.
	ulid string
	seq  int
	// began is set once the response is past admission (in_progress).
	began bool
	// msg is the answer's text item, once its first text came; calls are
	// its function call items by the model's call index.
	msg   *textItem
	calls map[int]*callItem
	// order is the items in the order they were added (output_index).
	order []any
	// failure is the refusal a rejected or failed request amounts to.
	failure *refusal.Error
	// ended is set by the event that ends the response.
	ended bool
	// tokens is how many tokens were told: a token whose index is below
	// it is one a retried write put in the log twice.
	tokens int
}

type textItem struct {
	index int
	id    string
	text  strings.Builder
}

type callItem struct {
	index int
	call  openai.ResponseFunctionCall
}

// NewResponseEncoder starts the Response of requestID ("chat-" and a
// ULID) with what the request asked for.
func NewResponseEncoder(requestID string, base openai.Response) *ResponseEncoder {
	ulid := strings.TrimPrefix(requestID, "chat-")
	base.ID = ResponseID(requestID)
	base.Object = openai.ObjectResponse
	base.Status = openai.ResponseQueued
	base.Output = []any{}
	if base.Metadata == nil {
		base.Metadata = map[string]string{}
	}
	return &ResponseEncoder{resp: base, ulid: ulid, calls: map[int]*callItem{}}
}

// ResponseIDPrefix starts a response's id; its request's id is "chat-"
// and the same ULID.
const ResponseIDPrefix = "resp_"

// ResponseID is the id of requestID's response.
func ResponseID(requestID string) string {
	return ResponseIDPrefix + strings.TrimPrefix(requestID, "chat-")
}

// RequestID is the request behind a response id, false when id is not
// a response's.
func RequestID(responseID string) (string, bool) {
	ulid, ok := strings.CutPrefix(responseID, ResponseIDPrefix)
	if !ok || ulid == "" {
		return "", false
	}
	return "chat-" + ulid, true
}

// Response is the Response as it stands: while it runs, its items hold
// what was said so far.
func (e *ResponseEncoder) Response() openai.Response {
	r := e.resp
	if !e.ended {
		r.Output = e.output(openai.ResponseInProgress)
	}
	return r
}

// Failure is the refusal a failed response amounts to, nil if none.
func (e *ResponseEncoder) Failure() *refusal.Error { return e.failure }

// Ended reports whether the response has ended.
func (e *ResponseEncoder) Ended() bool { return e.ended }

// encode is what ev adds to the stream, numbered on from the last.
func (e *ResponseEncoder) Encode(ev events.Event) []openai.ResponseEvent {
	if e.ended {
		return nil
	}
	var out []openai.ResponseEvent
	switch ev.Type {
	case events.TypeAccepted:
		e.resp.ServiceTier = ServiceTierOf(ev)
		if ms, ok := eventMillis(ev.ID); ok {
			e.resp.CreatedAt = ms / 1000
		}
		out = append(out, e.whole(openai.EventResponseCreated), e.whole(openai.EventResponseQueued))
	case events.TypeStage:
		var sg events.Stage
		if json.Unmarshal(ev.Data, &sg) == nil && sg.Stage != request.StageEmbed && sg.Stage != request.StageAdmission {
			out = e.begin(out)
		}
	case events.TypeToken:
		out = e.token(ev, e.begin(out))
	case events.TypeDone:
		out = e.done(ev, e.begin(out))
	case events.TypeRejected, events.TypeError:
		e.failure = Failure(ev)
		e.resp.Status = openai.ResponseFailed
		if e.failure.Code == request.ReasonCancelled {
			e.resp.Status = openai.ResponseCancelled
		}
		e.resp.Error = &openai.ResponseError{Code: responseErrorCode(e.failure), Message: e.failure.Message}
		// What was said before it ended stays, cut short.
		e.resp.Output = e.output(openai.ResponseIncomplete)
		e.ended = true
		out = append(out, e.whole(openai.EventResponseFailed))
	}
	return e.number(out)
}

// begin adds in_progress once the request is past admission.
func (e *ResponseEncoder) begin(out []openai.ResponseEvent) []openai.ResponseEvent {
	if e.began {
		return out
	}
	e.began = true
	e.resp.Status = openai.ResponseInProgress
	return append(out, e.whole(openai.EventResponseInProgress))
}

// token adds a token's text to the message item, or its tool call pieces
// to their function call items, opening each on its first piece.
func (e *ResponseEncoder) token(ev events.Event, out []openai.ResponseEvent) []openai.ResponseEvent {
	var t events.Token
	if json.Unmarshal(ev.Data, &t) != nil || t.Notice || t.Choice != 0 || t.Index < e.tokens {
		return out
	}
	e.tokens = t.Index + 1
	if t.Model != "" {
		e.resp.Model = t.Model
	}
	if t.Text != "" {
		if e.msg == nil {
			e.msg = &textItem{index: len(e.order), id: "msg_" + e.ulid}
			e.order = append(e.order, e.msg)
			idx := e.msg.index
			out = append(out,
				openai.ResponseEvent{Type: openai.EventOutputItemAdded, OutputIndex: &idx, Item: e.message(openai.ResponseInProgress, false)},
				openai.ResponseEvent{Type: openai.EventContentPartAdded, OutputIndex: &idx, ContentIndex: intp(0), ItemID: e.msg.id,
					Part: outputText("")})
		}
		e.msg.text.WriteString(t.Text)
		idx, delta := e.msg.index, t.Text
		out = append(out, openai.ResponseEvent{Type: openai.EventOutputTextDelta, OutputIndex: &idx, ContentIndex: intp(0),
			ItemID: e.msg.id, Delta: &delta, Logprobs: &[]any{}})
	}
	for _, piece := range t.ToolCalls {
		c, ok := e.calls[piece.Index]
		if !ok {
			c = &callItem{index: len(e.order), call: openai.ResponseFunctionCall{Type: openai.ItemFunctionCall,
				ID: "fc_" + e.ulid + "_" + strconv.Itoa(piece.Index), CallID: piece.ID, Name: piece.Function.Name, Status: openai.ResponseInProgress}}
			e.calls[piece.Index] = c
			e.order = append(e.order, c)
			idx, item := c.index, c.call
			out = append(out, openai.ResponseEvent{Type: openai.EventOutputItemAdded, OutputIndex: &idx, Item: item})
		}
		c.call.CallID = cmp.Or(c.call.CallID, piece.ID)
		c.call.Name = cmp.Or(c.call.Name, piece.Function.Name)
		if piece.Function.Arguments != "" {
			c.call.Arguments += piece.Function.Arguments
			idx, delta := c.index, piece.Function.Arguments
			out = append(out, openai.ResponseEvent{Type: openai.EventFunctionArgumentDelta, OutputIndex: &idx, ItemID: c.call.ID, Delta: &delta})
		}
	}
	return out
}

// done closes every open item in order and ends the response: completed,
// or incomplete when the answer was cut at max_output_tokens or filtered.
func (e *ResponseEncoder) done(ev events.Event, out []openai.ResponseEvent) []openai.ResponseEvent {
	var d events.Done
	if err := json.Unmarshal(ev.Data, &d); err != nil {
		e.failure = &refusal.Error{Class: refusal.Internal, Code: request.ReasonInternal, Message: "unreadable answer"}
		e.resp.Status, e.ended = openai.ResponseFailed, true
		e.resp.Error = &openai.ResponseError{Code: "server_error", Message: e.failure.Message}
		return append(out, e.whole(openai.EventResponseFailed))
	}
	if e.resp.Model == "" || len(e.order) == 0 && d.Model != "" {
		e.resp.Model = cmp.Or(d.Model, e.resp.Model)
	}
	e.resp.ServiceTier = cmp.Or(e.resp.ServiceTier, d.ServiceTier)
	itemStatus := openai.ResponseCompleted
	e.resp.Status = openai.ResponseCompleted
	switch FinishReason(d.FinishReason) {
	case openai.FinishLength:
		e.resp.Status, itemStatus = openai.ResponseIncomplete, openai.ResponseIncomplete
		e.resp.IncompleteDetails = &openai.IncompleteDetails{Reason: "max_output_tokens"}
	case openai.FinishContentFilter:
		e.resp.Status, itemStatus = openai.ResponseIncomplete, openai.ResponseIncomplete
		e.resp.IncompleteDetails = &openai.IncompleteDetails{Reason: "content_filter"}
	}
	for _, it := range e.order {
		switch it := it.(type) {
		case *textItem:
			idx, text := it.index, it.text.String()
			out = append(out,
				openai.ResponseEvent{Type: openai.EventOutputTextDone, OutputIndex: &idx, ContentIndex: intp(0), ItemID: it.id, Text: &text,
					Logprobs: &[]any{}},
				openai.ResponseEvent{Type: openai.EventContentPartDone, OutputIndex: &idx, ContentIndex: intp(0), ItemID: it.id, Part: outputText(text)},
				openai.ResponseEvent{Type: openai.EventOutputItemDone, OutputIndex: &idx, Item: e.message(itemStatus, true)})
		case *callItem:
			it.call.Status = openai.ResponseCompleted
			idx, args := it.index, it.call.Arguments
			out = append(out,
				openai.ResponseEvent{Type: openai.EventFunctionArgumentDone, OutputIndex: &idx, ItemID: it.call.ID, Arguments: &args, Name: it.call.Name},
				openai.ResponseEvent{Type: openai.EventOutputItemDone, OutputIndex: &idx, Item: it.call})
		}
	}
	e.resp.Output = e.output(itemStatus)
	e.resp.Usage = &openai.ResponseUsage{InputTokens: d.Usage.PromptTokens, OutputTokens: d.Usage.CompletionTokens, TotalTokens: d.Usage.TotalTokens}
	if ms, ok := eventMillis(ev.ID); ok {
		at := ms / 1000
		e.resp.CompletedAt = &at
	}
	e.ended = true
	end := openai.EventResponseCompleted
	if e.resp.Status == openai.ResponseIncomplete {
		end = openai.EventResponseIncomplete
	}
	return append(out, e.whole(end))
}

// message is the text item as it stands; whole adds its text part.
func (e *ResponseEncoder) message(status string, whole bool) openai.ResponseMessage {
	m := openai.ResponseMessage{Type: openai.ItemMessage, ID: e.msg.id, Status: status, Role: openai.RoleAssistant, Content: []openai.OutputText{}}
	if whole {
		m.Content = append(m.Content, *outputText(e.msg.text.String()))
	}
	return m
}

// output is the items as they stand, in order.
func (e *ResponseEncoder) output(status string) []any {
	out := make([]any, 0, len(e.order))
	for _, it := range e.order {
		switch it := it.(type) {
		case *textItem:
			out = append(out, e.message(status, true))
		case *callItem:
			out = append(out, it.call)
		}
	}
	return out
}

// whole is an event that carries the Response as it stands.
func (e *ResponseEncoder) whole(typ string) openai.ResponseEvent {
	r := e.Response()
	return openai.ResponseEvent{Type: typ, Response: &r}
}

// next takes the next sequence number, for an event the encoder does
// not make (a stream's error).
func (e *ResponseEncoder) Next() int {
	e.seq++
	return e.seq - 1
}

// number numbers events on from the last.
func (e *ResponseEncoder) number(evs []openai.ResponseEvent) []openai.ResponseEvent {
	for i := range evs {
		evs[i].SequenceNumber = e.seq
		e.seq++
	}
	return evs
}

// responseErrorCode is OpenAI's error code for a failed response: a
// request it refused as malformed is invalid_prompt, anything else the
// server's fault (Sluice's own reason stays in the message and the
// stream's error event).
func responseErrorCode(f *refusal.Error) string {
	if f.Class == refusal.Invalid {
		return "invalid_prompt"
	}
	if f.Class == refusal.Unavailable {
		return "rate_limit_exceeded"
	}
	return "server_error"
}

// eventMillis is the Unix time in ms an event log entry id ("ms-seq")
// was written at.
func eventMillis(id string) (int64, bool) {
	ms, _, ok := strings.Cut(id, "-")
	if !ok {
		return 0, false
	}
	var n int64
	for _, c := range ms {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, ms != ""
}

func outputText(text string) *openai.OutputText {
	return &openai.OutputText{Type: openai.PartOutputText, Text: text, Annotations: []any{}, Logprobs: []any{}}
}

func intp(n int) *int { return &n }
