package workflows

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/stretchr/testify/mock"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/request"
)

// A stored response's answer is stored once the request has ended, after
// Finalize and before the usage ledger, with what it was asked; a refused
// attempt is retried.
func (s *chatSuite) TestStoredResponseIsStoredAfterFinalize() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.mockLLM()
	s.mockRecordUsage(nil)
	var stored []activities.StoreResponseInput
	var attempts atomic.Int32
	log := s.log
	s.env.OnActivity(a.StoreResponse, mock.Anything, mock.Anything).Return(func(_ context.Context, in activities.StoreResponseInput) error {
		log.record("StoreResponse")
		if attempts.Add(1) == 1 {
			return errors.New("response store: connection refused")
		}
		stored = append(stored, in)
		return nil
	})
	in := ledgerInput()
	in.Response = []byte(`{"model":"m","store":true}`)
	s.env.ExecuteWorkflow(ChatWorkflow, in)

	s.Equal(request.OutcomeDone, s.result().Outcome)
	calls := s.calls()
	s.Equal([]string{"EmbedQuery", "Admit", "Retrieve", "Rerank", "StreamLLM", "Finalize"}, calls[:6])
	s.Equal("RecordUsage", calls[len(calls)-1])
	s.Require().Len(stored, 1)
	s.Equal(activities.StoreResponseInput{RequestID: "chat-TEST", Tenant: "acme", Params: in.Response}, stored[0])
}

// A request that is no stored response stores nothing.
func (s *chatSuite) TestOnlyAStoredResponseIsStored() {
	s.mockEmbed()
	s.mockAdmit(granted, nil)
	s.mockRetrieveRerank()
	s.mockLLM()
	s.mockRecordUsage(nil)
	s.env.ExecuteWorkflow(ChatWorkflow, ledgerInput())
	s.Equal(request.OutcomeDone, s.result().Outcome)
	s.NotContains(s.calls(), "StoreResponse")
}
