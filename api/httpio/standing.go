package httpio

import (
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-dev/sluice/door"
)

// The headers of a POST a client may retry: its key, and the mark of an
// answer that follows the request an earlier POST with the key started.
const (
	IdempotencyHeader = "Idempotency-Key"
	ReplayedHeader    = "Idempotent-Replayed"
)

// WriteStanding tells the client where it stands, as OpenAI's headers do
// for rate limits (X-RateLimit-{Limit,Remaining,Reset}-{Tokens,Requests})
// and Sluice's for its monthly budget (X-Budget-*), with the replay mark.
func WriteStanding(h http.Header, s door.Standing) {
	writeBucket(h, "Tokens", s.Tokens)
	writeBucket(h, "Requests", s.Requests)
	if m := s.Month; m != nil {
		if m.Tokens > 0 {
			h.Set("X-Budget-Limit-Tokens", strconv.FormatInt(m.Tokens, 10))
			h.Set("X-Budget-Remaining-Tokens", strconv.FormatInt(m.TokensLeft, 10))
		}
		if m.SpendUSD > 0 {
			h.Set("X-Budget-Limit-Spend-USD", strconv.FormatFloat(m.SpendUSD, 'f', 6, 64))
			h.Set("X-Budget-Remaining-Spend-USD", strconv.FormatFloat(m.SpendLeftUSD, 'f', 6, 64))
		}
		h.Set("X-Budget-Reset", m.Resets.Format(time.RFC3339))
	}
	if s.Replayed {
		h.Set(ReplayedHeader, "true")
	}
}

func writeBucket(h http.Header, suffix string, b *door.Bucket) {
	if b == nil {
		return
	}
	h.Set("X-RateLimit-Limit-"+suffix, strconv.FormatFloat(b.Limit, 'f', 0, 64))
	h.Set("X-RateLimit-Remaining-"+suffix, strconv.FormatFloat(b.Remaining, 'f', 0, 64))
	// As OpenAI writes it: "1s", "6m0s".
	h.Set("X-RateLimit-Reset-"+suffix, b.ResetAfter.Round(time.Millisecond).String())
}
