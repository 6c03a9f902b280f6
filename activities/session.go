package activities

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/prompt"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/pkg/session"
)

// Owner is whom the session belongs to.
func (r SessionRef) Owner() session.Owner { return session.Owner{Tenant: r.Tenant, User: r.User} }

// history returns the session's newest turns that fit its token budget,
// and the tokens they add to a prompt. A session that cannot be read is
// asked without its history: memory makes answers better, its absence
// does not make them wrong. Admit (to route by the tokens) and StreamLLM
// (to build the prompt) each read it: handing the turns from one to the
// other would put up to history_tokens of text into the workflow's history
// for every request, a bigger cost than one more Redis read.
func (a *Chat) history(ctx context.Context, requestID string, ref *SessionRef) ([]prompt.Exchange, int) {
	if ref == nil || ref.HistoryTokens <= 0 || a.Sessions == nil {
		return nil, 0
	}
	ex, n, err := a.Sessions.History(ctx, a.Prompts, ref.Owner(), ref.ID, ref.HistoryTokens)
	if err != nil {
		a.logger(requestID).Warn("read session; asking without its history", "session", ref.ID, "err", err)
		return nil, 0
	}
	return ex, n
}

// recordAnswer records a finished stream's answer in its session before
// the client is told the answer is done. It reports whether that worked;
// if not, Finalize records the turn from the event stream.
func (a *Chat) recordAnswer(ctx context.Context, in LLMInput, finishReason string, answer []string) bool {
	if a.Sessions == nil {
		return false
	}
	outcome := request.OutcomeDone
	if finishReason == "length" {
		outcome = request.OutcomeTruncated
	}
	err := a.Sessions.Append(ctx, in.Session.Owner(), in.Session.ID, session.Turn{
		RequestID: in.RequestID, Query: in.Query, Answer: strings.Join(answer, ""),
		Outcome: outcome, At: time.Now().UTC(),
	})
	if err != nil {
		a.logger(in.RequestID).Warn("record answer in session", "session", in.Session.ID, "err", err)
		return false
	}
	return true
}

// recordTurn records a finished request in its session; a done request's
// answer is read back from its event stream.
func (a *Chat) recordTurn(ctx context.Context, in FinalizeInput) error {
	t := session.Turn{
		RequestID: in.RequestID, Query: in.Turn.Query, Outcome: in.Turn.Outcome,
		Reason: in.Turn.Reason, At: time.Now().UTC(),
	}
	if t.Outcome == request.OutcomeDone || t.Outcome == request.OutcomeTruncated {
		answer, err := a.streamedAnswer(ctx, in.RequestID)
		if err != nil {
			return err
		}
		t.Answer = answer
	}
	return a.Sessions.Append(ctx, in.Turn.Session.Owner(), in.Turn.Session.ID, t)
}

// streamedAnswer is the text of a request's token events.
func (a *Chat) streamedAnswer(ctx context.Context, requestID string) (string, error) {
	var b strings.Builder
	err := a.Events.Each(ctx, requestID, func(ev events.Event) error {
		if ev.Type != events.TypeToken {
			return nil
		}
		var tok events.Token
		if err := json.Unmarshal(ev.Data, &tok); err != nil {
			return fmt.Errorf("decode token of %s: %w", requestID, err)
		}
		b.WriteString(tok.Text)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("read answer of %s: %w", requestID, err)
	}
	return b.String(), nil
}
