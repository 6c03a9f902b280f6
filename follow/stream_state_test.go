package follow

import (
	"encoding/json"
	"testing"

	"github.com/sluice-dev/sluice/pkg/events"
)

// A token written twice (a write retried while Redis stalled) reaches the
// client once; a reader that resumed mid-answer starts where it is.
func TestRepeatedTokensAreDropped(t *testing.T) {
	tok := func(i int) events.Event {
		raw, _ := json.Marshal(events.Token{Text: "w", Index: i})
		return events.Event{Type: events.TypeToken, Data: raw}
	}
	var st streamState
	var sent []int
	for _, i := range []int{7, 8, 8, 9, 7, 10} {
		if !st.repeated(tok(i)) {
			sent = append(sent, i)
		}
	}
	if len(sent) != 4 || sent[0] != 7 || sent[3] != 10 {
		t.Fatalf("sent %v, want 7 8 9 10", sent)
	}
	if st.repeated(events.Event{Type: events.TypeDone, Data: json.RawMessage(`{}`)}) {
		t.Fatal("a done event counted as a repeated token")
	}
}
