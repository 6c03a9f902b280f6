package workflows

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/temporal"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/metrics"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/usage"
)

// mockRecordUsage records every RecordUsage call's entry; fail, if set,
// says whether an attempt fails.
func (s *chatSuite) mockRecordUsage(fail func() bool) *[]usage.Entry {
	log := s.log
	var entries []usage.Entry
	s.env.OnActivity(a.RecordUsage, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.RecordUsageInput) error {
		log.record("RecordUsage")
		if fail != nil && fail() {
			return errors.New("usage ledger: connection refused")
		}
		log.mu.Lock()
		entries = append(entries, in.Entry)
		log.mu.Unlock()
		return nil
	})
	return &entries
}

func ledgerInput() ChatInput {
	in := input()
	in.User, in.KeyID, in.ServiceTier = "alice", "key123456789", request.ClassFlex
	in.Settings.RecordUsage = true
	return in
}

// An answered request is recorded once, after Finalize (the terminal
// event and the permit's release), with what it consumed.
func (s *chatSuite) TestAnsweredRequestIsRecordedOnceAfterFinalize() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.mockLLM()
	entries := s.mockRecordUsage(nil)
	start := s.env.Now()
	s.env.ExecuteWorkflow(ChatWorkflow, ledgerInput())

	s.Equal(request.OutcomeDone, s.result().Outcome)
	s.Equal([]string{"EmbedQuery", "Admit", "Retrieve", "Rerank", "StreamLLM", "Finalize", "RecordUsage"}, s.calls())
	s.Require().Len(*entries, 1)
	e := (*entries)[0]
	s.Equal(usage.Entry{
		RequestID: "chat-TEST", Tenant: "acme", User: "alice", KeyID: "key123456789", Pool: "short", Route: "short",
		PromptTokens: 50, CompletionTokens: 20, Outcome: request.OutcomeDone, ServiceTier: request.ClassFlex, FinishedAt: e.FinishedAt,
	}, e)
	s.False(e.FinishedAt.Before(start), "the finish time is the workflow's clock at the end")
}

// Each way a request ends is recorded once, with its outcome and what it
// consumed: a queue timeout, a cancel while queued, a stream interrupted
// midway (with what it had streamed).
func (s *chatSuite) TestEveryEndIsRecordedOnce() {
	for _, tc := range []struct {
		name              string
		setup             func()
		outcome, reason   string
		prompt, completed int
	}{
		{"queue timeout", func() { s.mockEmbed(); s.mockAdmit(queued, &queued) },
			request.OutcomeRejected, request.ReasonQueueTimeout, 0, 0},
		{"cancelled", func() {
			s.mockEmbed()
			s.mockAdmit(queued, &queued)
			s.env.RegisterDelayedCallback(func() { s.env.SignalWorkflow(SignalCancel, CancelSignal{Reason: "client_request"}) }, 5*time.Second)
		}, request.OutcomeCancelled, request.ReasonCancelled, 0, 0},
		{"interrupted", func() {
			s.mockEmbed()
			s.mockAdmit(granted, nil)
			s.mockRetrieveRerank()
			s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(activities.LLMOutput{},
				temporal.NewNonRetryableApplicationError("broke", activities.ErrTypeStreamInterrupted, nil,
					events.Usage{PromptTokens: 300, CompletionTokens: 12, TotalTokens: 312}))
		}, request.OutcomeFailed, request.ReasonStreamInterrupted, 300, 12},
	} {
		s.Run(tc.name, func() {
			s.SetupTest()
			tc.setup()
			entries := s.mockRecordUsage(nil)
			s.env.ExecuteWorkflow(ChatWorkflow, ledgerInput())
			s.Equal(tc.outcome, s.result().Outcome)
			s.Equal(1, countOf(s.calls(), "RecordUsage"))
			s.Require().Len(*entries, 1)
			e := (*entries)[0]
			s.Equal(tc.outcome, e.Outcome)
			s.Equal(tc.reason, e.Reason)
			s.Equal(tc.prompt, e.PromptTokens)
			s.Equal(tc.completed, e.CompletionTokens)
			s.Equal("short", e.Pool)
		})
	}
}

// An answer from the answer cache is recorded with its cached tokens and
// no model tokens.
func (s *chatSuite) TestCachedAnswerIsRecordedWithCachedTokens() {
	s.mockEmbed()
	s.env.OnActivity(a.LookupAnswer, mock.Anything, mock.Anything).Return(activities.LookupAnswerOutput{Hit: true, FinishReason: "stop", CachedTokens: 42}, nil)
	entries := s.mockRecordUsage(nil)
	in := ledgerInput()
	in.Settings.AnswerCache = true
	s.env.ExecuteWorkflow(ChatWorkflow, in)
	s.Equal(request.OutcomeDone, s.result().Outcome)
	s.Require().Len(*entries, 1)
	e := (*entries)[0]
	s.Equal(request.RouteCache, e.Route)
	s.Equal(42, e.CachedTokens)
	s.Zero(e.PromptTokens + e.CompletionTokens)
}

// With the ledger off, nothing is recorded.
func (s *chatSuite) TestLedgerOffRecordsNothing() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.mockLLM()
	s.env.ExecuteWorkflow(ChatWorkflow, input())
	s.Equal(request.OutcomeDone, s.result().Outcome)
	s.NotContains(s.calls(), "RecordUsage")
}

// A ledger that refuses for longer than the local attempts does not hold
// up the answer: the client's terminal event was written by Finalize
// before, and the record is retried as a regular activity until the
// ledger takes it, once.
func (s *chatSuite) TestLedgerOutageIsRetriedInTheBackground() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.mockLLM()
	// Past the local attempts (30 s) into the regular activity's retries.
	var attempts atomic.Int32
	entries := s.mockRecordUsage(func() bool { return attempts.Add(1) <= 12 })
	s.env.ExecuteWorkflow(ChatWorkflow, ledgerInput())

	s.Equal(request.OutcomeDone, s.result().Outcome)
	calls := s.calls()
	s.Less(slices.Index(calls, "Finalize"), slices.Index(calls, "RecordUsage"), "the terminal event comes first")
	s.Greater(countOf(calls, "RecordUsage"), 2, "retried")
	s.Len(*entries, 1, "recorded once the ledger is back")
}

func countOf(calls []string, name string) int {
	n := 0
	for _, c := range calls {
		if c == name {
			n++
		}
	}
	return n
}

// A worker that wrote the record and died before reporting it leaves a
// retry that finds the record: the request is in the ledger once. The
// first attempt here writes to a real ledger and then fails, as an
// attempt whose reply was lost does.
func (s *chatSuite) TestRecordWrittenButNotReportedCountsOnce() {
	ledger, err := usage.OpenSQLite(context.Background(), usage.SQLiteOptions{Path: filepath.Join(s.T().TempDir(), "usage.db")})
	s.Require().NoError(err)
	defer ledger.Close()
	m := metrics.New(slog.New(slog.DiscardHandler))
	acts := &activities.Chat{Usage: ledger, Metrics: m, Logger: slog.New(slog.DiscardHandler)}
	var attempts atomic.Int32
	s.env.OnActivity(a.RecordUsage, mock.Anything, mock.Anything).Return(func(ctx context.Context, in activities.RecordUsageInput) error {
		err := acts.RecordUsage(ctx, in)
		if attempts.Add(1) == 1 {
			return errors.New("worker lost before its reply")
		}
		return err
	})
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.mockLLM()
	s.env.ExecuteWorkflow(ChatWorkflow, ledgerInput())
	s.Equal(request.OutcomeDone, s.result().Outcome)
	s.Equal(int32(2), attempts.Load())

	day := s.env.Now().UTC()
	rows, err := ledger.Query(context.Background(), usage.Query{Tenant: "acme", From: day.AddDate(0, 0, -1), To: day.AddDate(0, 0, 1), GroupBy: usage.GroupDay})
	s.Require().NoError(err)
	s.Require().Len(rows, 1)
	s.Equal(int64(1), rows[0].Requests)
	s.Equal(int64(70), rows[0].TotalTokens)
	writes := map[string]float64{}
	families, err := m.Registry().Gather()
	s.Require().NoError(err)
	for _, f := range families {
		if f.GetName() == "sluice_usage_records_total" {
			for _, mt := range f.GetMetric() {
				writes[mt.GetLabel()[0].GetValue()] = mt.GetCounter().GetValue()
			}
		}
	}
	s.Equal(map[string]float64{"inserted": 1, "duplicate": 1}, writes)
}
