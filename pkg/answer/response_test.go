package answer

import (
	"encoding/json"
	"testing"

	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/openai"
)

func event(typ string, data any) events.Event {
	raw, _ := json.Marshal(data)
	return events.Event{ID: "1700000000000-0", Type: typ, Data: raw}
}

// A token a retried write put in the log twice is told once, so that a
// reader of the raw log (the stored response) says what the followed
// stream said.
func TestResponseEncoderSkipsATokenWrittenTwice(t *testing.T) {
	enc := NewResponseEncoder("chat-01J", openai.Response{Model: "m"})
	deltas := 0
	for _, ev := range []events.Event{
		event(events.TypeAccepted, events.Accepted{RequestID: "chat-01J"}),
		event(events.TypeToken, events.Token{Text: "a", Index: 0}),
		event(events.TypeToken, events.Token{Text: "b", Index: 1}),
		event(events.TypeToken, events.Token{Text: "b", Index: 1}),
		event(events.TypeToken, events.Token{Text: "c", Index: 2}),
		event(events.TypeDone, events.Done{RequestID: "chat-01J", FinishReason: "stop"}),
	} {
		for _, re := range enc.Encode(ev) {
			if re.Type == openai.EventOutputTextDelta {
				deltas++
			}
		}
	}
	r := enc.Response()
	if deltas != 3 || !enc.Ended() || r.Status != openai.ResponseCompleted || r.ID != "resp_01J" || r.CreatedAt != 1700000000 {
		t.Fatalf("%d deltas, ended %v, response %+v", deltas, enc.Ended(), r)
	}
	msg, ok := r.Output[0].(openai.ResponseMessage)
	if !ok || msg.Content[0].Text != "abc" {
		t.Fatalf("output %+v", r.Output)
	}
}

func TestResponseAndRequestIDs(t *testing.T) {
	if got := ResponseID("chat-01J"); got != "resp_01J" {
		t.Fatal(got)
	}
	if id, ok := RequestID("resp_01J"); !ok || id != "chat-01J" {
		t.Fatal(id, ok)
	}
	for _, bad := range []string{"resp_", "chat-01J", ""} {
		if _, ok := RequestID(bad); ok {
			t.Errorf("%q read as a response id", bad)
		}
	}
}
