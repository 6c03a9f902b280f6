package workflows

import (
	"fmt"
	"testing"

	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
)

// What a failed stream consumed is read from its error, whichever way it
// ended, so that its reservation is refunded for the rest.
func TestStreamedBefore(t *testing.T) {
	used := events.Usage{PromptTokens: 40, CompletionTokens: 2, TotalTokens: 42}
	for _, tc := range []struct {
		name string
		err  error
		want *activities.Used
	}{
		{"cancelled mid-stream", fmt.Errorf("activity: %w", temporal.NewCanceledError(used)), &activities.Used{Tokens: 42, Requests: 1}},
		{"cancelled before a token", temporal.NewCanceledError(events.Usage{}), &activities.Used{}},
		{"cancelled, saying nothing", temporal.NewCanceledError(), nil},
		{"interrupted", temporal.NewNonRetryableApplicationError("x", activities.ErrTypeStreamInterrupted, nil, used), &activities.Used{Tokens: 42, Requests: 1}},
		{"permit lost", temporal.NewNonRetryableApplicationError("x", activities.ErrTypePermitLost, nil), &activities.Used{}},
		{"timed out", fmt.Errorf("timeout"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := streamedBefore(tc.err)
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Fatalf("streamedBefore = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The ledger bills a failed stream what it reported, prompt and
// completion apart; an end that says nothing bills nothing.
func TestPartialUsage(t *testing.T) {
	used := events.Usage{PromptTokens: 40, CompletionTokens: 2, TotalTokens: 42}
	for _, tc := range []struct {
		name string
		err  error
		want events.Usage
	}{
		{"cancelled mid-stream", fmt.Errorf("activity: %w", temporal.NewCanceledError(used)), used},
		{"cancelled, saying nothing", temporal.NewCanceledError(), events.Usage{}},
		{"interrupted", temporal.NewNonRetryableApplicationError("x", activities.ErrTypeStreamInterrupted, nil, used), used},
		{"backend unavailable", temporal.NewNonRetryableApplicationError("x", activities.ErrTypeBackendUnavailable, nil,
			activities.BackendUnavailable{}), events.Usage{}},
		{"timed out", fmt.Errorf("timeout"), events.Usage{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := partialUsage(tc.err); got != tc.want {
				t.Fatalf("partialUsage = %+v, want %+v", got, tc.want)
			}
		})
	}
}
