package chaos

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/converter"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/llm"
	"github.com/sluice-dev/sluice/tests/chatclient"
	"github.com/sluice-dev/sluice/workflows"
)

// failoverRecords reads each answered request's failovers from its
// workflow history (the StreamLLM activity's result), checks that each
// answer moved once, after exactly `at` tokens, and resumed, and returns
// the gaps the gateway measured.
func (s *stack) failoverRecords(rs []*chatclient.Result, at int) ([]time.Duration, []string) {
	var (
		mu       sync.Mutex
		gaps     []time.Duration
		problems []string
		wg       sync.WaitGroup
		sem      = make(chan struct{}, 4)
	)
	for _, r := range rs {
		if r.ID == "" {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			fs, err := s.streamFailovers(r.ID)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				problems = append(problems, err.Error())
			case len(fs) != 1 || fs[0].AfterTokens != at || fs[0].Outcome != llm.FailoverResumed || fs[0].From == fs[0].To:
				problems = append(problems, fmt.Sprintf("%s: failovers %+v, want one resumed on the other endpoint after %d tokens", r.ID, fs, at))
			default:
				gaps = append(gaps, time.Duration(fs[0].GapMs)*time.Millisecond)
			}
		})
	}
	wg.Wait()
	slices.Sort(gaps)
	return gaps, problems
}

// streamFailovers are the failovers the last completed StreamLLM of a
// request reported.
func (s *stack) streamFailovers(id string) ([]activities.StreamFailover, error) {
	it := s.tc.GetWorkflowHistory(context.Background(), workflows.ChatWorkflowID(id), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var out *activities.LLMOutput
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return nil, fmt.Errorf("read history of %s: %w", id, err)
		}
		done := ev.GetActivityTaskCompletedEventAttributes()
		if done == nil {
			continue
		}
		var o activities.LLMOutput
		// Other activities' results decode too, without failovers or usage.
		if converter.GetDefaultDataConverter().FromPayloads(done.GetResult(), &o) == nil && o.Usage.CompletionTokens > 0 {
			out = &o
		}
	}
	if out == nil {
		return nil, fmt.Errorf("%s: no completed StreamLLM in its history", id)
	}
	return out.Failovers, nil
}

// percentile is the q-quantile of sorted durations (0 if none).
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}
