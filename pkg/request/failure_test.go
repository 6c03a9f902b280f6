package request

import (
	"strings"
	"testing"
	"time"
)

func TestRetryAfterSeconds(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int
	}{
		{-time.Second, 1}, {0, 1}, {time.Millisecond, 1}, {time.Second, 1},
		{time.Second + time.Millisecond, 2}, {1999 * time.Millisecond, 2}, {30 * time.Second, 30},
	} {
		if got := RetryAfterSeconds(c.d); got != c.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

// Every refusal reason has its own message, and one that names a delay
// names the rounded one.
func TestRefused(t *testing.T) {
	seen := map[string]string{}
	for _, reason := range []string{ReasonQueueTimeout, ReasonQueueFull, ReasonTenantQueueFull, ReasonShed, ReasonUnavailable, ReasonBackendUnavailable} {
		f := Refused(reason, 1500*time.Millisecond)
		if f.Reason != reason || f.RetryAfterS != 2 {
			t.Errorf("%s: %+v", reason, f)
		}
		if strings.Contains(f.Message, "(") || seen[f.Message] != "" {
			t.Errorf("%s: message %q is the fallback or another reason's (%s)", reason, f.Message, seen[f.Message])
		}
		seen[f.Message] = reason
	}
	if got := Refused(ReasonUnavailable, 2*time.Second).Message; got != "A service Sluice depends on was unavailable. Please retry in 2 s." {
		t.Errorf("unavailable: %q", got)
	}
}
