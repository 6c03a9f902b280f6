package workflows

import (
	"context"
	"time"

	"github.com/stretchr/testify/mock"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/request"
)

// The request's token estimate and its tier's concurrency cap reach every
// admission call, the first and the look at the deadline alike.
func (s *chatSuite) TestAdmitCarriesTokensAndConcurrencyCap() {
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
	in := deadlineInput(5 * time.Second)
	in.AdmissionTokens = 1234
	in.Settings.MaxConcurrent = 2
	s.env.ExecuteWorkflow(ChatWorkflow, in)
	s.Equal(request.OutcomeDone, s.result().Outcome)
	s.Require().Len(admits, 2)
	for i, got := range admits {
		s.Equal(1234, got.Tokens, "call %d", i)
		s.Equal(2, got.MaxConcurrent, "call %d", i)
	}
}
