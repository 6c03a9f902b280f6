package answer

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/openai"
)

// ReadResponse is requestID's Response as its whole event log tells it,
// from base, the Response as asked: ended, or as it stands.
func ReadResponse(ctx context.Context, log *events.Log, requestID string, base openai.Response) (*ResponseEncoder, error) {
	enc := NewResponseEncoder(requestID, base)
	err := log.Each(ctx, requestID, func(ev events.Event) error {
		enc.Encode(ev)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the events of %s: %w", requestID, err)
	}
	return enc, nil
}
