package answer

import (
	"context"
	"fmt"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/openai"
)

// logPage is how many events one read of a log takes.
const logPage = 1000

// ReadResponse is requestID's Response as its whole event log tells it,
// from base, the Response as asked: ended, or as it stands.
func ReadResponse(ctx context.Context, log *events.Log, requestID string, base openai.Response) (*ResponseEncoder, error) {
	enc := NewResponseEncoder(requestID, base)
	after := "0"
	for {
		evs, err := log.After(ctx, requestID, after, logPage)
		if err != nil {
			return nil, fmt.Errorf("read the events of %s: %w", requestID, err)
		}
		for _, ev := range evs {
			enc.Encode(ev)
		}
		if len(evs) < logPage {
			return enc, nil
		}
		after = evs[len(evs)-1].ID
	}
}
