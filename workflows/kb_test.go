package workflows

import (
	"context"
	"sync"

	"github.com/stretchr/testify/mock"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/request"
)

// Every stage knows the request's kb by its key: a tenant's own kb as
// "<tenant>/<name>", so its retrieval and answer cache entries are its
// own; a shared kb (an input without an owner) by its bare name.
func (s *chatSuite) TestStagesKnowTheKBByItsKey() {
	for _, tc := range []struct{ tenant, want string }{{"acme", "acme/docs"}, {"", "docs"}} {
		s.SetupTest()
		var mu sync.Mutex
		var seen []string
		see := func(kb string) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, kb)
		}
		s.mockEmbed()
		s.env.OnActivity(a.LookupAnswer, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.LookupAnswerInput) (activities.LookupAnswerOutput, error) {
			see(in.KB)
			return activities.LookupAnswerOutput{Ms: 1}, nil
		})
		s.env.OnActivity(a.Admit, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.AdmitInput) (activities.AdmitOutput, error) {
			see(in.KB)
			return granted, nil
		})
		s.env.OnActivity(a.Retrieve, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.RetrieveInput) (activities.RetrieveOutput, error) {
			see(in.KB)
			return activities.RetrieveOutput{KBVersion: 3, Hits: hits}, nil
		})
		s.env.OnActivity(a.Rerank, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.RerankInput) (activities.RerankOutput, error) {
			see(in.KB)
			return activities.RerankOutput{Hits: in.Hits}, nil
		})
		s.env.OnActivity(a.StreamLLM, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.LLMInput) (activities.LLMOutput, error) {
			see(in.KB)
			return activities.LLMOutput{FinishReason: "stop", DoneWritten: true}, nil
		})
		in := input()
		in.KB, in.KBTenant = "docs", tc.tenant
		in.Settings.AnswerCache = true
		s.env.ExecuteWorkflow(ChatWorkflow, in)
		s.Equal(request.OutcomeDone, s.result().Outcome)
		s.Equal([]string{tc.want, tc.want, tc.want, tc.want, tc.want}, seen, "kb of lookup, admit, retrieve, rerank, stream")
	}
}
