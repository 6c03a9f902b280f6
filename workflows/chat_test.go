package workflows

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"

	"github.com/stretchr/testify/mock"
	"github.com/stretchr/testify/suite"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/request"
)

var registerOpts = workflow.RegisterOptions{Name: ChatWorkflowName}

type chatSuite struct {
	suite.Suite
	testsuite.WorkflowTestSuite
	env *testsuite.TestWorkflowEnvironment
	log *callLog
}

// callLog records one test's activity calls. Every test gets its own, and
// a mock writes to the log of the test that registered it: the test
// environment does not wait for a cancelled local activity to return, so
// a mock can still run after its workflow completed, and must not write
// into the next test's log.
type callLog struct {
	mu       sync.Mutex
	names    []string
	finalize []activities.FinalizeInput
	onStop   func()
}

func (l *callLog) record(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.names = append(l.names, name)
}

func TestChatWorkflow(t *testing.T) { suite.Run(t, new(chatSuite)) }

func (s *chatSuite) SetupTest() {
	s.env = s.NewTestWorkflowEnvironment()
	s.env.RegisterWorkflowWithOptions(ChatWorkflow, registerOpts)
	s.env.RegisterActivity(&activities.Chat{})
	log := &callLog{}
	s.log = log
	s.env.OnActivity(a.Finalize, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.FinalizeInput) error {
		log.record("Finalize")
		log.mu.Lock()
		log.finalize = append(log.finalize, in)
		log.mu.Unlock()
		return nil
	}).Maybe()
	s.env.OnActivity(a.StopStream, mock.Anything, mock.Anything).Return(func(context.Context, activities.StopStreamInput) error {
		log.record("StopStream")
		log.mu.Lock()
		onStop := log.onStop
		log.mu.Unlock()
		if onStop != nil {
			onStop()
		}
		return nil
	}).Maybe()
}

func (s *chatSuite) AfterTest(_, _ string) { s.env.AssertExpectations(s.T()) }

// calls are the activities the current test's mocks saw so far, in order.
func (s *chatSuite) calls() []string {
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	return slices.Clone(s.log.names)
}

// onStop sets what the StopStream mock does after recording the call.
func (s *chatSuite) onStop(f func()) {
	s.log.mu.Lock()
	defer s.log.mu.Unlock()
	s.log.onStop = f
}

func input() ChatInput {
	return ChatInput{
		RequestID: "chat-TEST", Tenant: "acme", Query: "how does a token bucket refill?", KB: "sluice-docs", MaxTokens: 64,
		Settings: ChatSettings{
			MaxWait: 30 * time.Second, RecheckInterval: 5 * time.Second, DisconnectGrace: 5 * time.Second,
			TopK: 3, Candidates: 10, LLMTimeout: time.Minute, LLMHeartbeat: 10 * time.Second, LLMMaxAttempts: 3,
		},
	}
}

var hits = []activities.ChunkRef{{ID: "d1#0", Score: 1}, {ID: "d2#0", Score: 0.5}}

func (s *chatSuite) mockEmbed() {
	log := s.log
	s.env.OnActivity(a.EmbedQuery, mock.Anything, mock.Anything).Return(func(context.Context, activities.EmbedInput) (activities.EmbedOutput, error) {
		log.record("EmbedQuery")
		return activities.EmbedOutput{Cache: "miss", Dims: 256, Ms: 1}, nil
	})
}

// mockAdmit answers the first call and every re-check with the given states.
func (s *chatSuite) mockAdmit(first activities.AdmitOutput, recheck *activities.AdmitOutput) {
	log := s.log
	s.env.OnActivity(a.Admit, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.AdmitInput) (activities.AdmitOutput, error) {
		if in.Recheck {
			log.record("Recheck")
			if in.Pool != "short" || in.Seq != 7 {
				return activities.AdmitOutput{}, errors.New("re-check lost pool or seq")
			}
			return *recheck, nil
		}
		log.record("Admit")
		return first, nil
	})
}

func (s *chatSuite) mockRetrieveRerank() {
	log := s.log
	s.env.OnActivity(a.Retrieve, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.RetrieveInput) (activities.RetrieveOutput, error) {
		log.record("Retrieve")
		if in.K != 10 {
			return activities.RetrieveOutput{}, errors.New("retrieve should fetch Candidates")
		}
		return activities.RetrieveOutput{KBVersion: 3, Hits: hits, Ms: 2}, nil
	})
	s.env.OnActivity(a.Rerank, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.RerankInput) (activities.RerankOutput, error) {
		log.record("Rerank")
		if in.KBVersion != 3 || in.KB != "sluice-docs" {
			return activities.RerankOutput{}, errors.New("rerank lost the kb version")
		}
		return activities.RerankOutput{Hits: in.Hits[:1], Ms: 1}, nil
	})
}

func (s *chatSuite) mockLLM() {
	log := s.log
	s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.LLMInput) (activities.LLMOutput, error) {
		log.record("StreamLLM")
		if in.Pool != "short" || len(in.Context) != 1 || in.KBVersion != 3 {
			return activities.LLMOutput{}, errors.New("llm got the wrong pool or context")
		}
		return activities.LLMOutput{Usage: events.Usage{PromptTokens: 50, CompletionTokens: 20, TotalTokens: 70}, FinishReason: "stop", FirstTokenMs: 30, Ms: 300}, nil
	})
}

var granted = activities.AdmitOutput{Pool: "short", Granted: true, Seq: 7, Ms: 1}
var queued = activities.AdmitOutput{Pool: "short", Position: 3, EstimatedWaitMs: 4000, Seq: 7, Ms: 1}

func (s *chatSuite) result() ChatResult {
	s.True(s.env.IsWorkflowCompleted())
	s.NoError(s.env.GetWorkflowError())
	var r ChatResult
	s.NoError(s.env.GetWorkflowResult(&r))
	return r
}

func (s *chatSuite) onlyFinalize() activities.FinalizeInput {
	s.log.mu.Lock()
	finalize := slices.Clone(s.log.finalize)
	s.log.mu.Unlock()
	s.Require().Len(finalize, 1, "finalize must run exactly once")
	return finalize[0]
}

func (s *chatSuite) TestHappyPathRunsStagesInOrder() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.mockLLM()
	s.env.ExecuteWorkflow(ChatWorkflow, input())

	r := s.result()
	s.Equal(request.OutcomeDone, r.Outcome)
	s.Equal("short", r.Route)
	s.Equal(70, r.Usage.TotalTokens)
	s.Equal(int64(3), r.KBVersion)
	s.Equal([]string{"EmbedQuery", "Admit", "Retrieve", "Rerank", "StreamLLM", "Finalize"}, s.calls())
	var stages []string
	for _, t := range r.Timings {
		stages = append(stages, t.Stage)
	}
	s.Equal([]string{request.StageEmbed, request.StageAdmission, request.StageRetrieval, request.StageRerank, "llm_first_token", request.StageLLM}, stages)

	f := s.onlyFinalize()
	s.Equal("short", f.Pool, "the permit must be released")
	s.Equal(events.TypeDone, f.EventType, "the stream did not write done, so finalize must")
	s.Require().NotNil(f.Done)
	s.Require().NotNil(f.Answer)
	s.Equal("stop", f.Answer.FinishReason)
	s.False(f.StopStream)
	s.Equal(&activities.Used{Tokens: 70, Requests: 1}, f.Used, "the refund is computed from actual usage")

	v, err := s.env.QueryWorkflow(QueryStatus)
	s.NoError(err)
	var st Status
	s.NoError(v.Get(&st))
	s.Equal(request.StageFinished, st.Stage)
	s.Equal(request.OutcomeDone, st.Outcome)
}

// A gateway request is admitted and streamed with the client's whole
// conversation and parameters: nothing is embedded, retrieved or reranked.
func (s *chatSuite) TestGatewayModeSkipsRetrieval() {
	s.mockAdmit(granted, nil)
	log := s.log
	conv := []openai.Message{openai.TextMessage("system", "be brief"), openai.TextMessage("user", "hi")}
	temp := 0.5
	s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.LLMInput) (activities.LLMOutput, error) {
		log.record("StreamLLM")
		if !in.Gateway || len(in.Conversation) != 2 || in.Sampling == nil || *in.Sampling.Temperature != 0.5 || len(in.Context) != 0 {
			return activities.LLMOutput{}, errors.New("llm did not get the client's conversation and parameters")
		}
		return activities.LLMOutput{Usage: events.Usage{PromptTokens: 9, CompletionTokens: 3, TotalTokens: 12}, FinishReason: "tool_calls", Model: "m-1"}, nil
	})
	in := input()
	in.Query, in.KB, in.Gateway, in.Conversation, in.Sampling = "", "", true, conv, &openai.Sampling{Temperature: &temp}
	s.env.ExecuteWorkflow(ChatWorkflow, in)

	r := s.result()
	s.Equal(request.OutcomeDone, r.Outcome)
	s.Equal("tool_calls", r.FinishReason)
	s.Equal([]string{"Admit", "StreamLLM", "Finalize"}, s.calls())
	s.Equal(&activities.Used{Tokens: 12, Requests: 1}, s.onlyFinalize().Used)
}

// When the stream wrote the done event itself, finalize only releases.
func (s *chatSuite) TestDoneWrittenByStreamIsNotRepeated() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.LLMInput) (activities.LLMOutput, error) {
		if in.Done == nil || in.Done.Route != "short" || in.Done.KBVersion != 3 || len(in.Done.Timings) != 4 {
			return activities.LLMOutput{}, errors.New("stream did not get the done event so far")
		}
		return activities.LLMOutput{FinishReason: "stop", DoneWritten: true}, nil
	})
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	s.Equal(request.OutcomeDone, s.result().Outcome)
	f := s.onlyFinalize()
	s.Equal("short", f.Pool)
	s.Empty(f.EventType, "done must not be written twice")
}

func (s *chatSuite) TestAdmissionTimeoutByTimer() {
	s.mockEmbed()
	s.mockAdmit(queued, &queued)
	start := s.env.Now()
	s.env.ExecuteWorkflow(ChatWorkflow, input())

	r := s.result()
	s.Equal(request.OutcomeRejected, r.Outcome)
	s.Equal(request.ReasonQueueTimeout, r.Reason)
	waited := s.env.Now().Sub(start)
	s.GreaterOrEqual(waited, 30*time.Second, "must wait the full maxWait")
	s.Less(waited, 36*time.Second)
	s.NotContains(s.calls(), "Retrieve")
	s.Contains(s.calls(), "Recheck")

	f := s.onlyFinalize()
	s.Equal("short", f.Pool, "the queue entry must be removed")
	s.Equal(&activities.Used{}, f.Used, "a request rejected in the queue consumed nothing")
	s.Equal(events.TypeRejected, f.EventType)
	s.Equal(request.ReasonQueueTimeout, f.Failure.Reason)
	s.Equal(4, f.Failure.RetryAfterS)
	s.NotEmpty(f.Failure.Message)
}

// A class that refuses late requests ends a queued request at once when
// the wait estimated ahead of it is longer than its deadline leaves, and
// says why; its place is given back.
func (s *chatSuite) TestRefusedLateByTheEstimate() {
	s.mockEmbed()
	s.mockAdmit(queued, &queued)
	start := s.runRefusingLate()

	r := s.result()
	s.Equal(request.OutcomeRejected, r.Outcome)
	s.Equal(request.ReasonDeadlineUnreachable, r.Reason)
	s.Less(s.env.Now().Sub(start), time.Second, "refused before its deadline")
	s.NotContains(s.calls(), "Recheck")
	f := s.onlyFinalize()
	s.Equal("short", f.Pool, "the queue entry must be removed")
	s.Equal(events.TypeRejected, f.EventType)
	s.Equal(request.ReasonDeadlineUnreachable, f.Failure.Reason)
	s.Equal(4, f.Failure.RetryAfterS)
	s.Contains(f.Failure.Message, "about 4s of waiting is ahead of it")
	s.Contains(f.Failure.Message, "priority class's time to first token of 1s")
}

// runRefusingLate runs a priority request of a class that refuses late
// requests (TTFT SLO and max wait 1 s), and returns when it started.
func (s *chatSuite) runRefusingLate() time.Time {
	in := input()
	in.ServiceTier, in.Settings.TTFTSLO, in.Settings.MaxWait, in.Settings.RefuseLate = "priority", time.Second, time.Second, true
	start := s.env.Now()
	s.env.ExecuteWorkflow(ChatWorkflow, in)
	return start
}

// waitedItsDeadline checks that the request started at start was refused
// as late only once its whole deadline had passed, having rechecked.
func (s *chatSuite) waitedItsDeadline(start time.Time) {
	r := s.result()
	s.Equal(request.ReasonDeadlineUnreachable, r.Reason)
	s.GreaterOrEqual(s.env.Now().Sub(start), time.Second, "waited its whole deadline")
	s.Contains(s.calls(), "Recheck")
}

// A request for which a stream may be paused is not refused by the
// turnover estimate, which knows nothing of pausing: it waits for its
// deadline (or a pause's grant), as one whose wait looked short does.
func (s *chatSuite) TestNotRefusedByTheEstimateWhenAStreamMayPause() {
	s.mockEmbed()
	mayPause := queued
	mayPause.MayPause = true
	s.mockAdmit(mayPause, &mayPause)
	start := s.runRefusingLate()

	s.waitedItsDeadline(start)
}

// A request of such a class whose wait looked short enough waits until
// its deadline, then is told it passed.
func (s *chatSuite) TestRefusedLateAtTheDeadline() {
	s.mockEmbed()
	near := queued
	near.EstimatedWaitMs = 500
	s.mockAdmit(near, &near)
	start := s.runRefusingLate()

	s.waitedItsDeadline(start)
	f := s.onlyFinalize()
	s.Equal(request.ReasonDeadlineUnreachable, f.Failure.Reason)
	s.Contains(f.Failure.Message, "waited until its deadline")
}

func (s *chatSuite) TestAdmittedBySignal() {
	s.mockEmbed()
	s.mockAdmit(queued, &queued)
	s.mockRetrieveRerank()
	s.mockLLM()
	s.env.RegisterDelayedCallback(func() {
		v, err := s.env.QueryWorkflow(QueryStatus)
		s.NoError(err)
		var st Status
		s.NoError(v.Get(&st))
		s.Equal(request.StageAdmission, st.Stage)
		s.Equal(3, st.Position)
		s.env.SignalWorkflow(SignalAdmitted, AdmittedSignal{Pool: "short"})
	}, 7*time.Second)
	s.env.ExecuteWorkflow(ChatWorkflow, input())

	r := s.result()
	s.Equal(request.OutcomeDone, r.Outcome)
	s.Equal([]string{"EmbedQuery", "Admit", "Retrieve", "Rerank", "StreamLLM", "Finalize"}, s.calls(), "a waiter does not re-check before its deadline")
}

func (s *chatSuite) TestAdmittedOnRecheck() {
	s.mockEmbed()
	s.mockAdmit(queued, &granted)
	s.mockRetrieveRerank()
	s.mockLLM()
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	s.Equal(request.OutcomeDone, s.result().Outcome)
	s.Equal([]string{"EmbedQuery", "Admit", "Recheck", "Retrieve", "Rerank", "StreamLLM", "Finalize"}, s.calls())
}

func (s *chatSuite) TestQueueFullRejects() {
	s.mockEmbed()
	s.mockAdmit(activities.AdmitOutput{Pool: "long", Full: true}, nil)
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	r := s.result()
	s.Equal(request.OutcomeRejected, r.Outcome)
	s.Equal(request.ReasonQueueFull, r.Reason)
	f := s.onlyFinalize()
	s.Equal(events.TypeRejected, f.EventType)
	s.Positive(f.Failure.RetryAfterS)
	s.NotContains(s.calls(), "Retrieve")
}

func (s *chatSuite) TestCancelSignalWhileQueued() {
	s.mockEmbed()
	s.mockAdmit(queued, &queued)
	s.env.RegisterDelayedCallback(func() {
		s.env.SignalWorkflow(SignalCancel, CancelSignal{Reason: "client_request"})
	}, 12*time.Second)
	s.env.ExecuteWorkflow(ChatWorkflow, input())

	r := s.result()
	s.Equal(request.OutcomeCancelled, r.Outcome)
	f := s.onlyFinalize()
	s.Equal("short", f.Pool, "a cancelled waiter must leave the queue")
	s.Equal(events.TypeError, f.EventType)
	s.Equal(request.ReasonCancelled, f.Failure.Reason)
	s.Contains(f.Failure.Message, "client_request")
	s.NotContains(s.calls(), "Retrieve")
	s.NotContains(s.calls(), "StopStream", "no stream was running")
}

// blockingLLM streams until it is told to stop through the stop flag
// (StopStream). It ignores its context on purpose: on a real server a
// running activity learns of cancellation only with a later heartbeat, and
// the stop flag must end it without that.
func (s *chatSuite) blockingLLM(stopped chan struct{}) {
	log := s.log
	s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(func(ctx context.Context, _ activities.LLMInput) (activities.LLMOutput, error) {
		log.record("StreamLLM")
		giveUp := time.After(20 * time.Second)
		for {
			select {
			case <-giveUp:
				return activities.LLMOutput{}, errors.New("never told to stop")
			case <-stopped:
				return activities.LLMOutput{}, temporal.NewNonRetryableApplicationError("stopped", activities.ErrTypeCancelled, nil)
			case <-time.After(5 * time.Millisecond):
				activity.RecordHeartbeat(ctx, 1)
			}
		}
	})
}

// streamUntilStopped mocks a request granted at once whose stream runs
// until its stop flag is raised, which closes the channel it returns.
func (s *chatSuite) streamUntilStopped() chan struct{} {
	stopped := make(chan struct{})
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.blockingLLM(stopped)
	s.onStop(func() { close(stopped) })
	return stopped
}

// awaitStopFlag waits for the stop flag a cancel raised: the workflow may
// complete before that local activity has returned.
func (s *chatSuite) awaitStopFlag(stopped chan struct{}) {
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		s.Fail("the stop flag was never raised")
	}
}

func (s *chatSuite) TestCancelSignalDuringStream() {
	stopped := s.streamUntilStopped()
	s.env.RegisterDelayedCallback(func() {
		s.env.SignalWorkflow(SignalCancel, CancelSignal{Reason: "client_request"})
	}, time.Second)
	s.env.ExecuteWorkflow(ChatWorkflow, input())

	r := s.result()
	s.Equal(request.OutcomeCancelled, r.Outcome)
	s.awaitStopFlag(stopped)
	s.Contains(s.calls(), "StopStream")
	f := s.onlyFinalize()
	s.Equal("short", f.Pool, "the permit must be released after a cancelled stream")
	// The stream must stop before its permit is given away. On a server the
	// workflow waits for the cancelled stream to end (WaitForCancellation),
	// but the test environment settles an activity's cancellation at once,
	// so the order of the stream's end and Finalize is not checked here.
	// What holds either way: Finalize raises the stop flag before it
	// releases.
	s.True(f.StopStream)
	s.Equal(request.ReasonCancelled, f.Failure.Reason)
}

func (s *chatSuite) TestLLMRetriesBeforeFirstToken() {
	log := s.log
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	attempts := 0
	s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(func(context.Context, activities.LLMInput) (activities.LLMOutput, error) {
		log.record("StreamLLM")
		attempts++
		if attempts == 1 {
			return activities.LLMOutput{}, temporal.NewApplicationError("backend 503", activities.ErrTypeBackend)
		}
		return activities.LLMOutput{FinishReason: "length", Ms: 10}, nil
	})
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	r := s.result()
	s.Equal(request.OutcomeDone, r.Outcome)
	s.Equal("length", r.FinishReason)
	s.Equal(2, attempts)
}

// llmFails mocks the stages before the LLM, and an LLM that fails with
// err every time; it returns the count of its calls.
func (s *chatSuite) llmFails(err error) *int {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	attempts := new(int)
	s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(func(context.Context, activities.LLMInput) (activities.LLMOutput, error) {
		*attempts++
		return activities.LLMOutput{}, err
	})
	return attempts
}

func (s *chatSuite) TestLLMInterruptedIsNotRetried() {
	attempts := s.llmFails(temporal.NewNonRetryableApplicationError("broke after 5 tokens", activities.ErrTypeStreamInterrupted, nil))
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	r := s.result()
	s.Equal(request.OutcomeFailed, r.Outcome)
	s.Equal(request.ReasonStreamInterrupted, r.Reason)
	s.Equal(1, *attempts)
	f := s.onlyFinalize()
	s.Equal(events.TypeError, f.EventType)
	s.Equal("short", f.Pool)
	s.Nil(f.Used, "an interruption that does not say what it streamed refunds nothing")
}

// A pool whose every backend has its circuit open fails the request at
// once: not retried, not blamed on the request, with when to retry.
func (s *chatSuite) TestBackendUnavailableFailsFastWithRetryAfter() {
	for _, tc := range []struct {
		name    string
		details []any
		secs    int
	}{
		{"rounded up", []any{activities.BackendUnavailable{RetryAfter: 7200 * time.Millisecond}}, 8},
		{"at least a second", []any{activities.BackendUnavailable{}}, 1},
		{"without details", nil, 1},
	} {
		s.Run(tc.name, func() {
			s.SetupTest()
			attempts := s.llmFails(temporal.NewNonRetryableApplicationError("llm pool short: all 2 endpoints have their circuit open",
				activities.ErrTypeBackendUnavailable, nil, tc.details...))
			s.env.ExecuteWorkflow(ChatWorkflow, input())
			r := s.result()
			s.Equal(request.OutcomeFailed, r.Outcome)
			s.Equal(request.ReasonBackendUnavailable, r.Reason)
			s.Equal(1, *attempts, "an unavailable pool is not retried")
			f := s.onlyFinalize()
			s.Equal(events.TypeError, f.EventType)
			s.Equal("short", f.Pool)
			s.Require().NotNil(f.Failure)
			s.Equal(request.ReasonBackendUnavailable, f.Failure.Reason)
			s.Equal(tc.secs, f.Failure.RetryAfterS)
			s.Contains(f.Failure.Message, "service is unavailable")
			s.NotContains(f.Failure.Message, "could not be processed")
			s.Equal(&activities.Used{}, f.Used, "nothing was sent: the whole charge is refunded")
			s.Equal(request.ReasonBackendUnavailable, f.Report.Reason)
		})
	}
}

// A stage that could not reach a dependency (Redis failing over) is
// retried, and when its retries run out the request ends unavailable with
// when to retry, not internal_error; a plain fault stays internal_error.
func (s *chatSuite) TestUnreachableDependencyEndsUnavailable() {
	unreachable := temporal.NewApplicationError("CLUSTERDOWN Hash slot not served", activities.ErrTypeDependencyUnavailable)
	for _, tc := range []struct {
		stage  string
		err    error
		reason string
	}{
		{"embed", unreachable, request.ReasonUnavailable},
		{"admit", unreachable, request.ReasonUnavailable},
		{"retrieve", unreachable, request.ReasonUnavailable},
		{"retrieve", errors.New("index corrupt"), request.ReasonInternal},
		// No cause: a local activity that ran out of time on every
		// attempt. Only a stalled dependency makes a stage before the
		// model do that.
		{"retrieve", temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_START_TO_CLOSE, nil), request.ReasonUnavailable},
	} {
		s.Run(tc.stage+" "+tc.reason, func() {
			s.SetupTest()
			calls := 0
			fail := func() error { calls++; return tc.err }
			if tc.stage == "embed" {
				s.env.OnActivity(a.EmbedQuery, mock.Anything, mock.Anything).Return(func(context.Context, activities.EmbedInput) (activities.EmbedOutput, error) {
					return activities.EmbedOutput{}, fail()
				})
			} else {
				s.mockEmbed()
			}
			if tc.stage == "admit" {
				s.env.OnActivity(a.Admit, mock.Anything, mock.Anything).Return(func(context.Context, activities.AdmitInput) (activities.AdmitOutput, error) {
					return activities.AdmitOutput{}, fail()
				})
			} else {
				s.mockAdmit(granted, nil)
			}
			s.env.OnActivity(a.Retrieve, mock.Anything, mock.Anything).Return(func(context.Context, activities.RetrieveInput) (activities.RetrieveOutput, error) {
				return activities.RetrieveOutput{}, fail()
			})
			s.env.ExecuteWorkflow(ChatWorkflow, input())
			r := s.result()
			s.Equal(request.OutcomeFailed, r.Outcome)
			s.Equal(tc.reason, r.Reason)
			s.Greater(calls, 1, "the stage is retried first")
			f := s.onlyFinalize()
			s.Equal(events.TypeError, f.EventType)
			s.Require().NotNil(f.Failure)
			s.Equal(tc.reason, f.Failure.Reason)
			s.NotContains(f.Failure.Message, "CLUSTERDOWN", "the client hears what happened, not the dependency's error")
			s.NotContains(f.Failure.Message, "index corrupt")
			if tc.reason == request.ReasonUnavailable {
				s.Equal(2, f.Failure.RetryAfterS)
			} else {
				s.Zero(f.Failure.RetryAfterS)
			}
		})
	}
}

// A model call that times out is the backend's slowness, not an
// unreachable dependency: it is not reported as unavailable.
func (s *chatSuite) TestLLMTimeoutIsNotUnavailable() {
	s.llmFails(temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_START_TO_CLOSE, nil))
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	r := s.result()
	s.Equal(request.OutcomeFailed, r.Outcome)
	s.NotEqual(request.ReasonUnavailable, r.Reason)
}

func (s *chatSuite) TestInterruptedStreamRefundsTheRest() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(activities.LLMOutput{},
		temporal.NewNonRetryableApplicationError("broke", activities.ErrTypeStreamInterrupted, nil,
			events.Usage{PromptTokens: 300, CompletionTokens: 12, TotalTokens: 312}))
	in := input()
	in.RateReservation = "r1\nrb\n1\n600 10 600 t tenant"
	s.env.ExecuteWorkflow(ChatWorkflow, in)
	s.Equal(request.OutcomeFailed, s.result().Outcome)
	f := s.onlyFinalize()
	s.Equal(&activities.Used{Tokens: 312, Requests: 1}, f.Used)
	s.Equal(in.RateReservation, f.Reservation, "the refund needs the reservation")
}

// The budget charge settles with what the ledger records: the tokens of
// an answer, or what an interrupted stream reported it had used.
func (s *chatSuite) TestBudgetSettlesWithTheLedgersTokens() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(activities.LLMOutput{},
		temporal.NewNonRetryableApplicationError("broke", activities.ErrTypeStreamInterrupted, nil,
			events.Usage{PromptTokens: 300, CompletionTokens: 12, TotalTokens: 312}))
	in := input()
	in.BudgetReservation = "b1\nkey\nchat-TEST\nepoch\n1 2"
	s.env.ExecuteWorkflow(ChatWorkflow, in)
	f := s.onlyFinalize()
	s.Equal(&activities.BudgetSettle{Reservation: in.BudgetReservation, PromptTokens: 300, CompletionTokens: 12, Pool: "short"}, f.Budget)
}

// A request without a budget charge settles none.
func (s *chatSuite) TestNoBudgetNoSettle() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.mockLLM()
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	s.Nil(s.onlyFinalize().Budget)
}

func (s *chatSuite) TestLocalActivityFailureFailsRequestAndReleases() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.env.OnActivity(a.Retrieve, mock.Anything, mock.Anything).Return(activities.RetrieveOutput{}, errors.New("redis down"))
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	r := s.result()
	s.Equal(request.OutcomeFailed, r.Outcome)
	f := s.onlyFinalize()
	s.Equal("short", f.Pool)
	s.Equal(events.TypeError, f.EventType)
}

// A kb too large for any worker's memory ends the request with an error
// event of reason kb_too_large carrying the retrieval's explanation, after
// one attempt, and gives the permit back.
func (s *chatSuite) TestKBTooLargeFailsRequestWithItsReason() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	attempts := 0
	s.env.OnActivity(a.Retrieve, mock.Anything, mock.Anything).Return(func(context.Context, activities.RetrieveInput) (activities.RetrieveOutput, error) {
		attempts++
		return activities.RetrieveOutput{}, temporal.NewNonRetryableApplicationError(
			`knowledge base "big" would need about 900.0 MiB of memory loaded, more than the 512.0 MiB a worker holds for knowledge bases`,
			activities.ErrTypeKBTooLarge, nil)
	})
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	s.Equal(request.OutcomeFailed, s.result().Outcome)
	s.Equal(request.ReasonKBTooLarge, s.result().Reason)
	s.Equal(1, attempts)
	f := s.onlyFinalize()
	s.Equal(events.TypeError, f.EventType)
	s.Require().NotNil(f.Failure)
	s.Equal(request.ReasonKBTooLarge, f.Failure.Reason)
	s.Contains(f.Failure.Message, `knowledge base "big" would need about 900.0 MiB`)
	s.Equal("short", f.Pool, "the permit is given back")
}

// If the first admission call fails after it may have taken a permit, the
// pool is unknown: finalize must release in every pool.
func (s *chatSuite) TestAdmitFailureReleasesEverywhere() {
	s.mockEmbed()
	s.env.OnActivity(a.Admit, mock.Anything, mock.Anything).Return(activities.AdmitOutput{}, errors.New("redis timeout after EVALSHA"))
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	r := s.result()
	s.Equal(request.OutcomeFailed, r.Outcome)
	f := s.onlyFinalize()
	s.Empty(f.Pool)
	s.True(f.AllPools)
}

func (s *chatSuite) TestEmbedFailureReleasesNothing() {
	s.env.OnActivity(a.EmbedQuery, mock.Anything, mock.Anything).Return(activities.EmbedOutput{}, errors.New("boom"))
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	f := s.onlyFinalize()
	s.Empty(f.Pool)
	s.False(f.AllPools, "admission never ran")
	s.Equal(events.TypeError, f.EventType)
}

func (s *chatSuite) TestDetachedClientCancelsAfterGrace() {
	s.mockEmbed()
	s.mockAdmit(queued, &queued)
	start := s.env.Now()
	s.env.RegisterDelayedCallback(func() {
		s.env.SignalWorkflow(SignalDetach, AttachSignal{})
	}, 2*time.Second)
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	r := s.result()
	s.Equal(request.OutcomeCancelled, r.Outcome)
	took := s.env.Now().Sub(start)
	s.GreaterOrEqual(took, 7*time.Second)
	s.Less(took, 10*time.Second)
	s.Contains(s.onlyFinalize().Failure.Message, "client_disconnected")
}

func (s *chatSuite) TestReattachWithinGraceKeepsRequest() {
	s.mockEmbed()
	s.mockAdmit(queued, &queued)
	s.env.RegisterDelayedCallback(func() { s.env.SignalWorkflow(SignalDetach, AttachSignal{}) }, 2*time.Second)
	s.env.RegisterDelayedCallback(func() { s.env.SignalWorkflow(SignalAttach, AttachSignal{}) }, 4*time.Second)
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	r := s.result()
	s.Equal(request.OutcomeRejected, r.Outcome, "it stays queued until maxWait instead of being cancelled")
	s.Equal(request.ReasonQueueTimeout, r.Reason)
}

func (s *chatSuite) TestWorkflowCancellationReleases() {
	s.mockEmbed()
	s.mockAdmit(queued, &queued)
	s.env.RegisterDelayedCallback(func() { s.env.CancelWorkflow() }, 3*time.Second)
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	s.True(s.env.IsWorkflowCompleted())
	f := s.onlyFinalize()
	s.Equal("short", f.Pool)
	s.Equal(request.ReasonCancelled, f.Failure.Reason)
}

// maybeRetrieve, maybeRerank and maybeLLM mock stages that a cancel may
// end the request before; StreamLLM is recorded so that a test can assert
// it never ran.
func (s *chatSuite) maybeRetrieve() {
	log := s.log
	s.env.OnActivity(a.Retrieve, mock.Anything, mock.Anything).Return(func(context.Context, activities.RetrieveInput) (activities.RetrieveOutput, error) {
		log.record("Retrieve")
		return activities.RetrieveOutput{KBVersion: 3, Hits: hits, Ms: 2}, nil
	}).Maybe()
}

func (s *chatSuite) maybeRerank() {
	log := s.log
	s.env.OnActivity(a.Rerank, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.RerankInput) (activities.RerankOutput, error) {
		log.record("Rerank")
		return activities.RerankOutput{Hits: in.Hits[:1], Ms: 1}, nil
	}).Maybe()
}

func (s *chatSuite) maybeLLM() {
	log := s.log
	s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(func(context.Context, activities.LLMInput) (activities.LLMOutput, error) {
		log.record("StreamLLM")
		return activities.LLMOutput{FinishReason: "stop"}, nil
	}).Maybe()
}

// assertCancelledAfterGrant checks the end of a request that held a permit
// and was cancelled before its LLM call: the permit is given back exactly
// once, by the one finalize, and no tokens were asked for or charged.
func (s *chatSuite) assertCancelledAfterGrant() {
	r := s.result()
	s.Equal(request.OutcomeCancelled, r.Outcome)
	s.Equal(request.ReasonCancelled, r.Reason)
	s.Equal("short", r.Route)
	s.NotContains(s.calls(), "StreamLLM", "a request cancelled before the LLM stage must not call it")
	s.NotContains(s.calls(), "StopStream", "no stream was running")
	f := s.onlyFinalize()
	s.Equal("short", f.Pool, "the granted permit must be released")
	s.False(f.AllPools, "the pool is known; releasing everywhere is for a lost admission answer")
	s.Equal(events.TypeError, f.EventType)
	s.Require().NotNil(f.Failure)
	s.Equal(request.ReasonCancelled, f.Failure.Reason)
	s.Contains(f.Failure.Message, "client_request")
	s.Equal(&activities.Used{}, f.Used, "nothing was consumed, so the whole reservation is refunded")
	s.Equal("Finalize", s.calls()[len(s.calls())-1])
}

// A cancel that arrives after the grant, while retrieval runs: the stage
// is cancelled, the LLM is never called, and the permit is released once.
func (s *chatSuite) TestCancelAfterGrantDuringRetrieval() {
	log := s.log
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.maybeRerank()
	s.maybeLLM()
	// The stage sends the cancel itself, so it surely arrives while
	// retrieval runs, then waits to be cancelled as a real stage would be.
	s.env.OnActivity(a.Retrieve, mock.Anything, mock.Anything).Return(func(ctx context.Context, _ activities.RetrieveInput) (activities.RetrieveOutput, error) {
		log.record("Retrieve")
		s.env.SignalWorkflow(SignalCancel, CancelSignal{Reason: "client_request"})
		select {
		case <-ctx.Done():
			return activities.RetrieveOutput{}, ctx.Err()
		case <-time.After(20 * time.Second):
			return activities.RetrieveOutput{}, errors.New("retrieval was never cancelled")
		}
	})
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	s.assertCancelledAfterGrant()
	s.Contains(s.calls(), "Retrieve")
	s.NotContains(s.calls(), "Rerank")
}

// The same during rerank, with a stage that does not watch its context and
// returns normally: the cancel still stops the request before the LLM.
func (s *chatSuite) TestCancelAfterGrantDuringRerank() {
	log := s.log
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.maybeRetrieve()
	s.maybeLLM()
	s.env.OnActivity(a.Rerank, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.RerankInput) (activities.RerankOutput, error) {
		log.record("Rerank")
		s.env.SignalWorkflow(SignalCancel, CancelSignal{Reason: "client_request"})
		return activities.RerankOutput{Hits: in.Hits[:1], Ms: 1}, nil
	})
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	s.assertCancelledAfterGrant()
	s.Contains(s.calls(), "Rerank")
}

// The releaser handed this queued request a permit and its admitted signal
// is in flight when the cancel arrives: both land at the same instant, in
// either order. Whatever the workflow makes of the pair, it holds a permit
// (or a place) in "short", and exactly one finalize must give it back.
func (s *chatSuite) TestCancelRacesAdmittedSignal() {
	for _, order := range []struct {
		name    string
		signals []string
	}{
		{"admitted first", []string{SignalAdmitted, SignalCancel}},
		{"cancel first", []string{SignalCancel, SignalAdmitted}},
	} {
		s.Run(order.name, func() {
			s.SetupTest()
			s.mockEmbed()
			s.mockAdmit(queued, &queued)
			s.maybeRetrieve()
			s.maybeRerank()
			s.maybeLLM()
			s.env.RegisterDelayedCallback(func() {
				for _, sig := range order.signals {
					switch sig {
					case SignalAdmitted:
						s.env.SignalWorkflow(SignalAdmitted, AdmittedSignal{Pool: "short"})
					case SignalCancel:
						s.env.SignalWorkflow(SignalCancel, CancelSignal{Reason: "client_request"})
					}
				}
			}, 7*time.Second)
			s.env.ExecuteWorkflow(ChatWorkflow, input())

			r := s.result()
			s.Equal(request.OutcomeCancelled, r.Outcome)
			s.NotContains(s.calls(), "StreamLLM")
			f := s.onlyFinalize()
			s.Equal("short", f.Pool, "the permit the signal announced must be released")
			s.False(f.AllPools)
			s.Equal(request.ReasonCancelled, f.Failure.Reason)
			s.env.AssertExpectations(s.T())
		})
	}
}

// A tenant already at its cap of waiting requests is turned away at once,
// with a reason and a retry hint, and takes nothing it must give back.
func (s *chatSuite) TestTenantQueueFullRejects() {
	s.mockEmbed()
	s.mockAdmit(activities.AdmitOutput{Pool: "short", TenantFull: true, Ms: 1}, nil)
	s.env.ExecuteWorkflow(ChatWorkflow, input())

	r := s.result()
	s.Equal(request.OutcomeRejected, r.Outcome)
	s.Equal(request.ReasonTenantQueueFull, r.Reason)
	s.Equal([]string{"EmbedQuery", "Admit", "Finalize"}, s.calls(), "no re-check, no later stage")
	f := s.onlyFinalize()
	s.Equal(events.TypeRejected, f.EventType)
	s.Require().NotNil(f.Failure)
	s.Equal(request.ReasonTenantQueueFull, f.Failure.Reason)
	s.GreaterOrEqual(f.Failure.RetryAfterS, 1)
	s.NotEmpty(f.Failure.Message)
	s.Equal(&activities.Used{}, f.Used, "a refused request consumed nothing")
	s.Equal("short", f.Pool, "releasing in the routed pool is a harmless no-op")
}

// A permit that expired before the stream started sends the request back
// to the queue at its old place, and the stream runs once it is granted
// again; nothing was consumed by the lost attempt.
func (s *chatSuite) TestPermitLostBeforeStreamQueuesAgain() {
	log := s.log
	s.mockEmbed()
	s.mockRetrieveRerank()
	var admits []activities.AdmitInput
	s.env.OnActivity(a.Admit, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.AdmitInput) (activities.AdmitOutput, error) {
		log.record("Admit")
		admits = append(admits, in)
		if len(admits) == 1 {
			return queued, nil
		}
		return granted, nil
	})
	attempts := 0
	s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(func(context.Context, activities.LLMInput) (activities.LLMOutput, error) {
		log.record("StreamLLM")
		attempts++
		if attempts == 1 {
			return activities.LLMOutput{}, temporal.NewNonRetryableApplicationError("lease ran out", activities.ErrTypePermitLost, nil)
		}
		return activities.LLMOutput{FinishReason: "stop", Usage: events.Usage{TotalTokens: 9}, Ms: 10}, nil
	})
	s.env.RegisterDelayedCallback(func() {
		s.env.SignalWorkflow(SignalAdmitted, AdmittedSignal{Pool: "short"})
	}, time.Second)
	in := input()
	in.AdmissionPlace = request.Place{Pool: "short", Tenant: in.Tenant, Weight: 1, Cost: 1, Tag: 42}
	s.env.ExecuteWorkflow(ChatWorkflow, in)
	s.Equal(request.OutcomeDone, s.result().Outcome)
	s.Equal([]string{"EmbedQuery", "Admit", "Retrieve", "Rerank", "StreamLLM", "Admit", "StreamLLM", "Finalize"}, s.calls())
	s.Require().Len(admits, 2)
	s.Equal(int64(42), admits[0].Place.Tag, "the first admission queues at the door's place")
	s.Equal("short", admits[1].Pool, "re-admission asks in the same pool")
	s.Equal(int64(7), admits[1].Seq, "re-admission restores the old place")
	s.Zero(admits[1].Place.Tag, "the door's place is taken once")
}

// deadlineInput waits at most maxWait for its grant.
func deadlineInput(maxWait time.Duration) ChatInput {
	in := input()
	in.Settings.MaxWait = maxWait
	return in
}

// A request that waits until its deadline costs the same however long it
// waits: one Admit, one timer, the signal; no re-checks. Its queue place
// is kept live for the whole wait.
func (s *chatSuite) TestDeadlineWaitAdmittedBySignalWithoutRechecks() {
	s.mockEmbed()
	var waitFor time.Duration
	s.env.OnActivity(a.Admit, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.AdmitInput) (activities.AdmitOutput, error) {
		if in.Recheck {
			s.log.record("Recheck")
			return queued, nil
		}
		s.log.record("Admit")
		waitFor = in.WaitFor
		return queued, nil
	})
	s.mockRetrieveRerank()
	s.mockLLM()
	s.env.RegisterDelayedCallback(func() {
		s.env.SignalWorkflow(SignalAdmitted, AdmittedSignal{Pool: "short"})
	}, 4*time.Minute)
	start := s.env.Now()
	s.env.ExecuteWorkflow(ChatWorkflow, deadlineInput(5*time.Minute))

	s.Equal(request.OutcomeDone, s.result().Outcome)
	s.Equal([]string{"EmbedQuery", "Admit", "Retrieve", "Rerank", "StreamLLM", "Finalize"}, s.calls())
	s.Equal(5*time.Minute, waitFor, "the queue place must live as long as the wait")
	s.GreaterOrEqual(s.env.Now().Sub(start), 4*time.Minute)
}

// At the deadline the request looks at the queue once: a grant whose
// signal was lost is found there; otherwise the request is rejected.
func (s *chatSuite) TestDeadlineWaitLooksOnceAtTheDeadline() {
	for _, tc := range []struct {
		name string
		last activities.AdmitOutput
		want string
	}{
		{"still queued", queued, request.OutcomeRejected},
		{"granted, signal lost", granted, request.OutcomeDone},
	} {
		s.Run(tc.name, func() {
			s.SetupTest()
			s.mockEmbed()
			s.mockAdmit(queued, &tc.last)
			s.maybeRetrieve()
			s.maybeRerank()
			s.maybeLLM()
			start := s.env.Now()
			s.env.ExecuteWorkflow(ChatWorkflow, deadlineInput(time.Minute))

			r := s.result()
			s.Equal(tc.want, r.Outcome)
			rechecks := 0
			for _, c := range s.calls() {
				if c == "Recheck" {
					rechecks++
				}
			}
			s.Equal(1, rechecks, "one look at the deadline, none before")
			s.GreaterOrEqual(s.env.Now().Sub(start), time.Minute)
			if tc.want == request.OutcomeRejected {
				s.Equal(request.ReasonQueueTimeout, r.Reason)
				s.Equal("short", s.onlyFinalize().Pool, "the queue entry must be removed")
			}
		})
	}
}

// A Finalize that Redis refuses for longer than its local retries is
// retried as a regular activity until it is written: the permit, the
// queue place and the refund are given back when Redis returns.
func (s *chatSuite) TestFinalizeIsRetriedUntilWritten() {
	s.env = s.NewTestWorkflowEnvironment()
	s.env.RegisterWorkflowWithOptions(ChatWorkflow, registerOpts)
	s.env.RegisterActivity(&activities.Chat{})
	var failing atomic.Bool
	failing.Store(true)
	var attempts atomic.Int32
	var written []activities.FinalizeInput
	s.env.OnActivity(a.Finalize, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.FinalizeInput) error {
		attempts.Add(1)
		if failing.Load() {
			return errors.New("redis: connection refused")
		}
		written = append(written, in)
		return nil
	})
	// Redis comes back four minutes in, well past the local retries.
	s.env.RegisterDelayedCallback(func() { failing.Store(false) }, 4*time.Minute)
	s.env.OnActivity(a.EmbedQuery, mock.Anything, mock.Anything).Return(activities.EmbedOutput{}, errors.New("redis: connection refused"))
	s.env.ExecuteWorkflow(ChatWorkflow, input())

	s.Require().True(s.env.IsWorkflowCompleted())
	s.Require().Len(written, 1, "Finalize must be written once Redis is back")
	s.Nil(written[0].Report, "the durable retry leaves the report out")
	s.Equal(events.TypeError, written[0].EventType)
	s.Greater(int(attempts.Load()), 2)
}

// The request's service class rides from its input to the stream (whose
// backend may take it as a priority), its done event, its status and
// its log line.
func (s *chatSuite) TestServiceClassRidesToTheAnswer() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.LLMInput) (activities.LLMOutput, error) {
		if in.ServiceTier != request.ClassFlex || in.Done == nil || in.Done.ServiceTier != request.ClassFlex {
			return activities.LLMOutput{}, errors.New("the stream did not get the request's class")
		}
		return activities.LLMOutput{FinishReason: "stop", DoneWritten: true}, nil
	})
	in := input()
	in.ServiceTier = request.ClassFlex
	s.env.ExecuteWorkflow(ChatWorkflow, in)
	s.Equal(request.OutcomeDone, s.result().Outcome)
	f := s.onlyFinalize()
	s.Require().NotNil(f.Report)
	s.Equal(request.ClassFlex, f.Report.ServiceTier)
	v, err := s.env.QueryWorkflow(QueryStatus)
	s.NoError(err)
	var st Status
	s.NoError(v.Get(&st))
	s.Equal(request.ClassFlex, st.ServiceTier)
}
