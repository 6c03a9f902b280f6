package workflows

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
)

func cachedInput() ChatInput {
	in := input()
	in.Settings.AnswerCache = true
	return in
}

func (s *chatSuite) mockLookup(out activities.LookupAnswerOutput, err error) {
	log := s.log
	s.env.OnActivity(a.LookupAnswer, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.LookupAnswerInput) (activities.LookupAnswerOutput, error) {
		log.record("LookupAnswer")
		if in.Done == nil || len(in.Done.Timings) != 1 || in.MaxTokens != 64 {
			return activities.LookupAnswerOutput{}, errors.New("lookup did not get the done event so far")
		}
		return out, err
	})
}

// A cached answer ends the request before admission: no permit, no
// retrieval, no LLM; only the request itself is charged.
func (s *chatSuite) TestAnswerCacheHitSkipsAdmissionAndLLM() {
	s.mockEmbed()
	s.mockLookup(activities.LookupAnswerOutput{Hit: true, KBVersion: 3, FinishReason: "stop", Sources: []string{"d1"}, Ms: 1}, nil)
	s.env.ExecuteWorkflow(ChatWorkflow, cachedInput())
	r := s.result()
	s.Equal(request.OutcomeDone, r.Outcome)
	s.Equal(request.RouteCache, r.Route)
	s.Equal([]string{"d1"}, r.Sources)
	s.Equal([]string{"EmbedQuery", "LookupAnswer", "Finalize"}, s.calls())
	f := s.onlyFinalize()
	s.Empty(f.Pool, "no permit was taken")
	s.False(f.AllPools)
	s.Empty(f.EventType, "the lookup wrote the done event")
	s.Equal(&activities.Used{Requests: 1}, f.Used, "no LLM tokens are charged")
}

func (s *chatSuite) TestAnswerCacheMissOrFailureAnswersAsUsual() {
	for _, tc := range []struct {
		name  string
		err   error
		bound int // what admission is handed to route by
	}{{"miss", nil, 321}, {"failure", errors.New("redis down"), 0}} {
		s.Run(tc.name, func() {
			s.SetupTest()
			s.mockEmbed()
			s.mockLookup(activities.LookupAnswerOutput{PromptBound: 321, Ms: 1}, tc.err)
			log := s.log
			s.env.OnActivity(a.Admit, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.AdmitInput) (activities.AdmitOutput, error) {
				log.record("Admit")
				if in.PromptBound != tc.bound {
					return activities.AdmitOutput{}, fmt.Errorf("admission handed prompt bound %d, want %d", in.PromptBound, tc.bound)
				}
				return granted, nil
			})
			s.mockRetrieveRerank()
			var cache bool
			s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.LLMInput) (activities.LLMOutput, error) {
				cache = in.CacheAnswer
				return activities.LLMOutput{FinishReason: "stop"}, nil
			})
			s.env.ExecuteWorkflow(ChatWorkflow, cachedInput())
			s.Equal(request.OutcomeDone, s.result().Outcome)
			s.Equal("short", s.result().Route)
			s.True(cache, "a complete answer should be offered to the cache")
			s.Contains(s.calls(), "Admit")
		})
	}
}

func (s *chatSuite) TestNoLookupWithoutAnswerCache() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.mockLLM()
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	s.Equal(request.OutcomeDone, s.result().Outcome)
	s.NotContains(s.calls(), "LookupAnswer")
}

func sessionInput() ChatInput {
	in := input()
	in.User = "alice"
	in.SessionID = "s1"
	in.Settings.HistoryTokens = 500
	return in
}

// The session reaches admission (routing counts its turns) and the
// stream; a turn the stream recorded is not recorded again.
func (s *chatSuite) TestSessionTurnRecordedOnce() {
	s.mockEmbed()
	// The session is its user's, not the whole tenant's.
	want := &activities.SessionRef{Tenant: "acme", User: "alice", ID: "s1", HistoryTokens: 500}
	s.env.OnActivity(a.Admit, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.AdmitInput) (activities.AdmitOutput, error) {
		if in.Session == nil || *in.Session != *want {
			return activities.AdmitOutput{}, errors.New("admission did not get the session")
		}
		return granted, nil
	})
	s.mockRetrieveRerank()
	s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.LLMInput) (activities.LLMOutput, error) {
		if in.Session == nil || *in.Session != *want || in.CacheAnswer {
			return activities.LLMOutput{}, errors.New("stream did not get the session")
		}
		return activities.LLMOutput{FinishReason: "stop", DoneWritten: true, TurnRecorded: true}, nil
	})
	s.env.ExecuteWorkflow(ChatWorkflow, sessionInput())
	s.Equal(request.OutcomeDone, s.result().Outcome)
	s.Nil(s.onlyFinalize().Turn)
}

// A stream that could not record its answer leaves it to finalize, which
// knows a cut answer from a complete one.
func (s *chatSuite) TestSessionTurnLeftToFinalize() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(activities.LLMOutput{FinishReason: "length", DoneWritten: true}, nil)
	s.env.ExecuteWorkflow(ChatWorkflow, sessionInput())
	f := s.onlyFinalize()
	s.Require().NotNil(f.Turn)
	s.Equal(activities.TurnInput{Session: activities.SessionRef{Tenant: "acme", User: "alice", ID: "s1", HistoryTokens: 500},
		Query: sessionInput().Query, Outcome: request.OutcomeTruncated}, *f.Turn)
}

// A request its queue turned away is recorded as such, so the session's
// next turn knows the question went unanswered.
func (s *chatSuite) TestSessionRecordsRejection() {
	s.mockEmbed()
	s.mockAdmit(activities.AdmitOutput{Pool: "short", Full: true}, nil)
	s.env.ExecuteWorkflow(ChatWorkflow, sessionInput())
	f := s.onlyFinalize()
	s.Equal(events.TypeRejected, f.EventType)
	s.Require().NotNil(f.Turn)
	s.Equal(request.OutcomeRejected, f.Turn.Outcome)
	s.Equal(request.ReasonQueueFull, f.Turn.Reason)
}

// A pool's own max wait replaces the default in that pool only.
func (s *chatSuite) TestPoolMaxWait() {
	for _, tc := range []struct {
		name   string
		byPool map[string]time.Duration
		want   time.Duration
	}{
		{"the queued pool's", map[string]time.Duration{"short": 90 * time.Second}, 90 * time.Second},
		{"another pool's", map[string]time.Duration{"long": 90 * time.Second}, 30 * time.Second},
	} {
		s.Run(tc.name, func() {
			s.SetupTest()
			s.mockEmbed()
			s.mockAdmit(queued, &queued)
			in := input()
			in.Settings.MaxWaitByPool = tc.byPool
			start := s.env.Now()
			s.env.ExecuteWorkflow(ChatWorkflow, in)
			s.Equal(request.ReasonQueueTimeout, s.result().Reason)
			waited := s.env.Now().Sub(start)
			s.GreaterOrEqual(waited, tc.want)
			s.Less(waited, tc.want+6*time.Second)
		})
	}
}

// Finalize gets what metrics and the request's log line record: route,
// outcome, every stage's time and the tenant.
func (s *chatSuite) TestFinalizeGetsTheReport() {
	s.mockEmbed()
	s.mockAdmit(activities.AdmitOutput{Pool: "long", Full: true}, nil)
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	r := s.onlyFinalize().Report
	s.Require().NotNil(r)
	s.Equal(activities.Report{Route: "long", Outcome: request.OutcomeRejected, Reason: request.ReasonQueueFull, Timings: s.result().Timings,
		Tenant: input().Tenant}, *r)
	s.Equal(request.StageEmbed, r.Timings[0].Stage)
}

// A waiting request the healer sheds ends rejected, with a Retry-After,
// and gives back its queue place.
func (s *chatSuite) TestShedWhileQueuedIsARejection() {
	s.mockEmbed()
	s.mockAdmit(queued, &queued)
	s.env.RegisterDelayedCallback(func() {
		s.env.SignalWorkflow(SignalCancel, CancelSignal{Reason: request.ReasonShed})
	}, 2*time.Second)
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	r := s.result()
	s.Equal(request.OutcomeRejected, r.Outcome)
	s.Equal(request.ReasonShed, r.Reason)
	f := s.onlyFinalize()
	s.Equal("short", f.Pool)
	s.Equal(events.TypeRejected, f.EventType)
	s.Equal(30, f.Failure.RetryAfterS)
	s.Equal(request.OutcomeRejected, f.Report.Outcome)
}

// A re-check that finds the request shed (the healer's signal not yet
// arrived) ends it the same way.
func (s *chatSuite) TestShedSeenByARecheck() {
	s.mockEmbed()
	calls := 0
	s.env.OnActivity(a.Admit, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.AdmitInput) (activities.AdmitOutput, error) {
		calls++
		if calls == 1 {
			return queued, nil
		}
		return activities.AdmitOutput{}, temporal.NewNonRetryableApplicationError("shed", activities.ErrTypeShed, nil)
	})
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	r := s.result()
	s.Equal(request.OutcomeRejected, r.Outcome)
	s.Equal(request.ReasonShed, r.Reason)
	s.Equal(30, s.onlyFinalize().Failure.RetryAfterS)
}
