package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/pkg/answer"
	"github.com/sluice-dev/sluice/pkg/openai"
)

// ResponseStore keeps the answers of stored responses
// (responses.Store).
type ResponseStore interface {
	Finish(ctx context.Context, id, tenant, status string, response json.RawMessage, at time.Time) error
}

// StoreResponseInput is a finished request whose answer is a stored
// response of the Responses API.
type StoreResponseInput struct {
	RequestID, Tenant string
	// Params is the Response as asked (openai.Response, before output).
	Params json.RawMessage
}

// StoreResponse stores a finished request's Response, as its event log
// tells it, so that the text goes from Redis to the store and never
// through a Temporal payload. Storing it again writes the same.
func (a *Chat) StoreResponse(ctx context.Context, in StoreResponseInput) error {
	if a.Responses == nil {
		// This worker runs with responses.store off while the API that
		// started the request has it on.
		a.logger(in.RequestID).Warn("responses.store off on this worker; response not stored")
		return nil
	}
	var base openai.Response
	if err := json.Unmarshal(in.Params, &base); err != nil {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("decode the parameters of %s: %v", in.RequestID, err), "bad_params", err)
	}
	enc, err := answer.ReadResponse(ctx, a.Events, in.RequestID, base)
	if err != nil {
		return err
	}
	resp := enc.Response()
	if !enc.Ended() {
		// The log lost its end (Redis lost it): the answer is not whole.
		resp.Status = openai.ResponseFailed
		resp.Error = &openai.ResponseError{Code: "server_error", Message: "the answer was lost before it was stored"}
	}
	raw, err := json.Marshal(resp)
	if err != nil {
		return fmt.Errorf("encode the response of %s: %w", in.RequestID, err)
	}
	return a.Responses.Finish(ctx, resp.ID, in.Tenant, resp.Status, raw, time.Now())
}
