package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/door"
	"github.com/sluice-dev/sluice/pkg/answer"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/refusal"
)

// responsesPath is OpenAI's Responses API, which new OpenAI clients call
// by default (client.responses.create). A response is a chat request
// like any other: the same door, the same workflow, told in the
// Responses API's objects and events.
const responsesPath = "/v1/responses"

// responseParamOf names the request field a shared check refused.
var responseParamOf = map[string]string{
	"empty_query":    "input",
	"bad_query":      "input",
	"query_too_long": "input",
	"bad_max_tokens": "max_output_tokens",
	"unknown_kb":     "kb",
}

func withResponseParam(err error) error {
	var ae *refusal.Error
	if errors.As(err, &ae) && ae.Param == "" {
		ae.Param = responseParamOf[ae.Code]
	}
	return err
}

// postResponses answers POST /v1/responses, streamed as the Responses
// API's events or whole as one Response.
func (s *Server) postResponses(c echo.Context) error {
	who, err := s.auth.Chat(c)
	if err != nil {
		return err
	}
	body, err := httpio.ReadJSONBody(c, s.cfg.API.MaxBodyBytes)
	if err != nil {
		return err
	}
	header := c.Request().Header.Get(kbHeader)
	rr, err := decodeResponseRequest(body)
	if err != nil {
		return err
	}
	stored, err := s.storing(rr)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	prior, err := s.priorItems(ctx, who.Tenant, rr.PreviousResponseID)
	if err != nil {
		return err
	}
	req, err := rr.chatRequest(header, prior)
	if err != nil {
		return err
	}
	if err := s.door.Validate(&req); err != nil {
		return withResponseParam(err)
	}
	base := responseBase(rr, rr.Model, time.Now().Unix())
	base.Store = stored
	var params json.RawMessage
	if stored {
		if params, err = json.Marshal(base); err != nil {
			return fmt.Errorf("encode the response's parameters: %w", err)
		}
		req.Response = params
	}
	adm, err := httpio.Admit(c, s.door, who, &req, door.Fingerprint(c.Path(), rr, header))
	if err != nil {
		return withResponseParam(err)
	}
	defer adm.Sub.Close()
	// As on chat completions, the model is the pool's until the answer's
	// first token names the one that answers.
	if p, ok := s.cfg.Pools.ByName()[adm.Pool]; ok {
		base.Model = p.Model
	}
	if stored {
		// Stored as this stream tells it, so that a stream read again
		// from the record tells every event alike.
		s.store(ctx, who, answer.ResponseID(adm.ID), rr, base)
	}
	enc := answer.NewResponseEncoder(adm.ID, base)
	switch {
	case rr.Stream:
		return s.streamResponse(c, adm.Sub, adm.ID, rr.Background, &responseSink{enc: enc})
	case rr.Background:
		// Queued, and nobody waits: it is read, streamed again or
		// cancelled by its id.
		c.Response().Header().Set("X-Request-ID", adm.ID)
		return c.JSON(http.StatusOK, enc.Response())
	}
	return s.awaitResponse(c, adm.Sub, adm.ID, enc)
}

// previous is the response rr continues, nil for none.
func (rr responseRequest) previous() *string {
	if rr.PreviousResponseID == "" {
		return nil
	}
	return &rr.PreviousResponseID
}

// responseBase is the Response as the request asked for it, before any
// of its events: OpenAI's defaults where the request set nothing.
func responseBase(rr responseRequest, model string, created int64) openai.Response {
	r := openai.Response{CreatedAt: created, Model: model, Instructions: rr.Instructions, MaxOutputTokens: rr.MaxOutputTokens,
		PreviousResponseID: rr.previous(), Background: rr.Background,
		Temperature: rr.Temperature, TopP: rr.TopP, ToolChoice: rr.ToolChoice, Tools: rr.Tools, Truncation: "disabled",
		ParallelToolCalls: rr.ParallelToolCalls == nil || *rr.ParallelToolCalls, Metadata: rr.Metadata}
	if len(r.ToolChoice) == 0 || string(r.ToolChoice) == "null" {
		r.ToolChoice = json.RawMessage(`"auto"`)
	}
	if r.Tools == nil {
		r.Tools = []openai.ResponseTool{}
	}
	r.Text = openai.ResponseText{Format: &openai.ResponseTextFormat{Type: openai.FormatText}}
	if rr.Text != nil && rr.Text.Format != nil {
		r.Text = *rr.Text
	}
	return r
}

// streamResponse tells the request's events as the Responses API's,
// through k (which has no writer yet).
func (s *Server) streamResponse(c echo.Context, sub *events.Subscription, id string, background bool, k *responseSink) error {
	return s.stream(c, sub, id, background, func(out httpio.SSEWriter) endingSink {
		k.out = &out
		return k
	})
}

// awaitResponse waits for the request's end and answers the Response
// whole: completed or incomplete with 200; a request refused or failed
// with the status its reason has, as chat completions do, so that a
// client retries what may be retried.
func (s *Server) awaitResponse(c echo.Context, sub *events.Subscription, id string, enc *answer.ResponseEncoder) error {
	if ok, err := s.await(c, sub, id, &responseSink{enc: enc}); !ok {
		return err
	}
	if enc.Failure() != nil {
		return enc.Failure()
	}
	return c.JSON(http.StatusOK, enc.Response())
}

// responseSink writes a request's events as the Responses API's, or only
// encodes them when out is nil (a whole response). Events the Responses
// API has none for (queue places) become SSE comments. A reader that
// re-attached from starting_after is sent only the events numbered from
// (starting_after + 1; 0: all): it reads the log from its start, so
// every event is numbered as it was the first time.
type responseSink struct {
	out  *httpio.SSEWriter
	enc  *answer.ResponseEncoder
	from int
}

func (k *responseSink) Write(ev events.Event) error {
	evs := k.enc.Encode(ev)
	if k.out == nil {
		return nil
	}
	if ev.Type == events.TypeQueue {
		var q events.Queue
		if json.Unmarshal(ev.Data, &q) == nil {
			return k.out.Printf(": queued position=%d estimated_wait_ms=%d\n\n", q.Position, q.EstimatedWaitMs)
		}
	}
	for _, re := range evs {
		if re.SequenceNumber < k.from {
			continue
		}
		if err := k.send(re); err != nil {
			return err
		}
	}
	return nil
}

func (k *responseSink) send(re any) error {
	raw, err := json.Marshal(re)
	if err != nil {
		return fmt.Errorf("encode response event: %w", err)
	}
	typ := "error"
	if e, ok := re.(openai.ResponseEvent); ok {
		typ = e.Type
	}
	return k.out.Printf("event: %s\ndata: %s\n\n", typ, raw)
}

// fail ends a stream cut short with OpenAI's error event, which its
// clients raise.
func (k *responseSink) fail(e *refusal.Error) error {
	body := ErrorBody(e)
	return k.send(map[string]any{"type": "error", "sequence_number": k.enc.Next(), "code": body.Error.Code,
		"message": body.Error.Message, "param": nil, "error": body.Error})
}

func (k *responseSink) KeepAlive() error {
	if k.out == nil {
		return nil
	}
	return k.out.Printf(": keep-alive\n\n")
}

func (k *responseSink) Flush() error {
	if k.out == nil {
		return nil
	}
	return k.out.Flush()
}
