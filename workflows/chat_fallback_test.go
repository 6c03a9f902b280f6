package workflows

import (
	"context"
	"fmt"
	"slices"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

// fallen is the activity's error for a pool that could not answer
// model before a first token, for reason.
func fallen(reason, model string) error {
	return temporal.NewNonRetryableApplicationError("the pool could not answer ("+reason+")", activities.ErrTypeFallback, nil,
		activities.Fallen{Reason: reason, Model: model})
}

// llmAnswersOn mocks StreamLLM: each call records "StreamLLM <pool>/<model>"
// and gets the next of errs (nil: an answer from the model asked), and
// fails when the request says it has a fallback left and wantFallBack's
// next entry says otherwise.
func (s *chatSuite) llmAnswersOn(wantFallBack []bool, errs ...error) {
	log := s.log
	calls := 0
	s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.LLMInput) (activities.LLMOutput, error) {
		log.record(fmt.Sprintf("StreamLLM %s/%s", in.Pool, in.Model))
		i := calls
		calls++
		if i >= len(errs) {
			return activities.LLMOutput{}, fmt.Errorf("unexpected stream %d", i)
		}
		if in.FallBack != wantFallBack[i] {
			return activities.LLMOutput{}, temporal.NewNonRetryableApplicationError(fmt.Sprintf("stream %d: FallBack %v", i, in.FallBack), "WrongInput", nil)
		}
		if errs[i] != nil {
			return activities.LLMOutput{}, errs[i]
		}
		return activities.LLMOutput{Usage: events.Usage{TotalTokens: 70}, FinishReason: "stop", Model: in.Model, Ms: 100}, nil
	})
}

// admitsEverywhere grants every admission in the pool it asks for.
func (s *chatSuite) admitsEverywhere() *[]activities.AdmitInput {
	log := s.log
	var asked []activities.AdmitInput
	s.env.OnActivity(a.Admit, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.AdmitInput) (activities.AdmitOutput, error) {
		log.record("Admit " + in.Pool)
		asked = append(asked, in)
		return activities.AdmitOutput{Pool: in.Pool, Granted: true, Seq: 7, Ms: 1}, nil
	})
	return &asked
}

func (s *chatSuite) finalizes() []activities.FinalizeInput {
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	return slices.Clone(s.log.finalize)
}

// Each trigger moves the request to another model on the same pool: the
// same permit, no release in between, and the answer, its done event and
// the status say which model answered and why.
func (s *chatSuite) TestFallbackToModelOnEachTrigger() {
	for _, reason := range []string{request.ReasonBackendUnavailable, request.FallbackContextTooLong, request.FallbackFirstTokenTimeout} {
		s.Run(reason, func() {
			s.SetupTest()
			s.mockEmbed()
			s.mockAdmit(granted, nil)
			s.mockRetrieveRerank()
			s.llmAnswersOn([]bool{true, false}, fallen(reason, "big"), nil)
			in := input()
			in.Settings.Fallbacks = map[string][]Fallback{"short": {{Model: "small"}}}
			s.env.ExecuteWorkflow(ChatWorkflow, in)

			r := s.result()
			s.Equal(request.OutcomeDone, r.Outcome)
			want := &events.Fallback{From: "big", To: "small", FromPool: "short", ToPool: "short", Reason: reason}
			s.Equal(want, r.Fallback)
			s.Equal([]string{"EmbedQuery", "Admit", "Retrieve", "Rerank", "StreamLLM short/", "StreamLLM short/small", "Finalize"}, s.calls())
			f := s.onlyFinalize()
			s.Equal("short", f.Pool)
			s.Require().NotNil(f.Done)
			s.Equal(want, f.Done.Fallback, "the done event says which model answered and why")
			s.Equal(&activities.Used{Tokens: 70, Requests: 1}, f.Used)

			v, err := s.env.QueryWorkflow(QueryStatus)
			s.Require().NoError(err)
			var st Status
			s.NoError(v.Get(&st))
			s.Equal([]events.Fallback{*want}, st.Fallbacks)
		})
	}
}

// A fallback to another pool gives this pool's permit back (settling
// nothing consumed) and asks for the other's through admission, as a new
// arrival there; the request ends in the pool that answered.
func (s *chatSuite) TestFallbackToPoolMovesThePermit() {
	s.mockEmbed()
	asked := s.admitsEverywhere()
	s.mockRetrieveRerank()
	s.llmAnswersOn([]bool{true, false}, fallen(request.FallbackContextTooLong, "sim"), nil)
	in := input()
	in.Pool = "short"
	in.Settings.Fallbacks = map[string][]Fallback{"short": {{Pool: "long", Model: "sim-long"}}}
	s.env.ExecuteWorkflow(ChatWorkflow, in)

	r := s.result()
	s.Equal(request.OutcomeDone, r.Outcome)
	s.Equal("long", r.Route)
	s.Equal(&events.Fallback{From: "sim", To: "sim-long", FromPool: "short", ToPool: "long", Reason: request.FallbackContextTooLong}, r.Fallback)
	s.Equal([]string{"EmbedQuery", "Admit short", "Retrieve", "Rerank", "StreamLLM short/", "Finalize", "Admit long", "StreamLLM long/sim-long", "Finalize"}, s.calls())
	s.Require().Len(*asked, 2)
	s.Equal(int64(0), (*asked)[1].Seq, "a new arrival in the other pool, not the old place")
	fs := s.finalizes()
	s.Require().Len(fs, 2)
	s.Equal(activities.FinalizeInput{RequestID: in.RequestID, Pool: "short", Used: &activities.Used{}}, fs[0], "the release of the short permit, and nothing else")
	s.Equal("long", fs[1].Pool)
	s.Equal(events.TypeDone, fs[1].EventType)
}

// With its fallbacks spent, a request ends as one without any: the last
// stream is not told to fall back, and its pool's refusal is the
// request's (backend_unavailable, with when to retry).
func (s *chatSuite) TestNoFallbackLeftEndsAsBefore() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	unavailable := temporal.NewNonRetryableApplicationError("llm pool short: all 1 endpoints have their circuit open",
		activities.ErrTypeBackendUnavailable, nil, activities.BackendUnavailable{})
	s.llmAnswersOn([]bool{true, false}, fallen(request.ReasonBackendUnavailable, "big"), unavailable)
	in := input()
	in.Settings.Fallbacks = map[string][]Fallback{"short": {{Model: "small"}}}
	s.env.ExecuteWorkflow(ChatWorkflow, in)

	r := s.result()
	s.Equal(request.OutcomeFailed, r.Outcome)
	s.Equal(request.ReasonBackendUnavailable, r.Reason)
	f := s.onlyFinalize()
	s.Equal(events.TypeError, f.EventType)
	s.Equal(request.ReasonBackendUnavailable, f.Failure.Reason)
	s.Equal(&activities.Used{}, f.Used, "nothing was streamed: the whole charge is refunded")
}

// A pool without fallbacks never asks its stream to fall back.
func (s *chatSuite) TestNoFallbacksNeverFallsBack() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.llmAnswersOn([]bool{false}, nil)
	in := input()
	in.Settings.Fallbacks = map[string][]Fallback{"long": {{Pool: "short", Model: "sim"}}}
	s.env.ExecuteWorkflow(ChatWorkflow, in)
	r := s.result()
	s.Equal(request.OutcomeDone, r.Outcome)
	s.Nil(r.Fallback)
}

// The door's fallback (a prompt too long for the pool of the model the
// client named) is in the answer and the status as the workflow's own.
func (s *chatSuite) TestDoorFallbackIsInTheAnswer() {
	s.mockEmbed()
	s.admitsEverywhere()
	s.mockRetrieveRerank()
	s.llmAnswersOn([]bool{false}, nil)
	in := input()
	in.Pool = "long"
	in.Fallback = &events.Fallback{From: "small", To: "large", FromPool: "short", ToPool: "long", Reason: request.FallbackContextTooLong}
	s.env.ExecuteWorkflow(ChatWorkflow, in)
	r := s.result()
	s.Equal(request.OutcomeDone, r.Outcome)
	s.Equal(in.Fallback, r.Fallback)
	f := s.onlyFinalize()
	s.Require().NotNil(f.Done)
	s.Equal(in.Fallback, f.Done.Fallback)
}

// A fallback's answer settles its budget charge at the pool and model
// that answered (the ledger's), also when the fallback's stream broke
// before its backend named the model: the one it asked for.
func (s *chatSuite) TestFallbackSettlesTheBudgetAtTheModelThatAnswered() {
	broke := temporal.NewNonRetryableApplicationError("broke", activities.ErrTypeStreamInterrupted, nil,
		events.Usage{PromptTokens: 300, CompletionTokens: 12, TotalTokens: 312})
	for name, tc := range map[string]struct {
		to   Fallback
		last error
		want activities.BudgetSettle
	}{
		"model":         {Fallback{Model: "small"}, nil, activities.BudgetSettle{Pool: "short", Model: "small"}},
		"model, broken": {Fallback{Model: "small"}, broke, activities.BudgetSettle{PromptTokens: 300, CompletionTokens: 12, Pool: "short", Model: "small"}},
		"pool":          {Fallback{Pool: "long", Model: "sim-long"}, nil, activities.BudgetSettle{Pool: "long", Model: "sim-long"}},
	} {
		s.Run(name, func() {
			s.SetupTest()
			s.mockEmbed()
			s.admitsEverywhere()
			s.mockRetrieveRerank()
			s.llmAnswersOn([]bool{true, false}, fallen(request.FallbackContextTooLong, "big"), tc.last)
			in := input()
			in.Pool = "short"
			in.BudgetReservation = "b1\nkey\nchat-TEST\nepoch\n1 2"
			in.Settings.Fallbacks = map[string][]Fallback{"short": {tc.to}}
			s.env.ExecuteWorkflow(ChatWorkflow, in)
			fs := s.finalizes()
			s.Require().NotEmpty(fs)
			want := tc.want
			want.Reservation = in.BudgetReservation
			s.Equal(&want, fs[len(fs)-1].Budget)
		})
	}
}
