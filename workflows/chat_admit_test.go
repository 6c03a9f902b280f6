package workflows

import (
	"context"
	"time"

	"github.com/stretchr/testify/mock"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/request"
)

// queuedThenGranted answers the request's first admission call queued
// and the next granted, records every call's input, and lets the rest of
// the request run.
func (s *chatSuite) queuedThenGranted() *[]activities.AdmitInput {
	s.mockEmbed()
	s.mockRetrieveRerank()
	s.mockLLM()
	var admits []activities.AdmitInput
	s.env.OnActivity(a.Admit, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.AdmitInput) (activities.AdmitOutput, error) {
		admits = append(admits, in)
		if len(admits) == 1 {
			return queued, nil
		}
		return granted, nil
	})
	return &admits
}

// The request's token estimate and its tier's concurrency cap reach every
// admission call, the first and the look at the deadline alike.
func (s *chatSuite) TestAdmitCarriesTokensAndConcurrencyCap() {
	admits := s.queuedThenGranted()
	in := deadlineInput(5 * time.Second)
	in.AdmissionTokens = 1234
	in.Settings.MaxConcurrent = 2
	s.env.ExecuteWorkflow(ChatWorkflow, in)
	s.Equal(request.OutcomeDone, s.result().Outcome)
	s.Require().Len(*admits, 2)
	for i, got := range *admits {
		s.Equal(1234, got.Tokens, "call %d", i)
		s.Equal(2, got.MaxConcurrent, "call %d", i)
	}
}

// The request's deadline and its class's TTFT SLO reach every admission
// call, so that a restored entry is ordered among its tenant's again.
func (s *chatSuite) TestAdmitCarriesTheDeadline() {
	admits := s.queuedThenGranted()
	in := deadlineInput(5 * time.Second)
	in.Settings.TTFTSLO = 700 * time.Millisecond
	in.Deadline = time.Date(2026, 1, 1, 0, 0, 0, 700e6, time.UTC)
	s.env.ExecuteWorkflow(ChatWorkflow, in)
	s.Equal(request.OutcomeDone, s.result().Outcome)
	s.Require().Len(*admits, 2)
	for i, got := range *admits {
		s.True(got.Deadline.Equal(in.Deadline), "call %d: deadline %s", i, got.Deadline)
		s.Equal(700*time.Millisecond, got.SLO, "call %d", i)
	}
}

// The door's route and prompt bound reach the answer-cache lookup and
// admission, which use them instead of counting again.
func (s *chatSuite) TestDoorRouteReachesTheLookupAndAdmission() {
	s.mockEmbed()
	var look activities.LookupAnswerInput
	s.env.OnActivity(a.LookupAnswer, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.LookupAnswerInput) (activities.LookupAnswerOutput, error) {
		look = in
		return activities.LookupAnswerOutput{PromptBound: in.PromptBound, Ms: 1}, nil
	})
	var adm activities.AdmitInput
	s.env.OnActivity(a.Admit, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.AdmitInput) (activities.AdmitOutput, error) {
		adm = in
		return activities.AdmitOutput{Pool: in.Pool, Granted: true, Ms: 1}, nil
	})
	s.mockRetrieveRerank()
	s.mockLLM()
	in := input()
	in.Settings.AnswerCache = true
	in.Pool, in.PromptBound = "short", 3000
	s.env.ExecuteWorkflow(ChatWorkflow, in)
	s.Equal(request.OutcomeDone, s.result().Outcome)
	s.Equal("short", look.Pool)
	s.Equal(3000, look.PromptBound)
	s.Equal("short", adm.Pool)
	s.Equal(3000, adm.PromptBound)
}
