package request

import (
	"fmt"
	"time"
)

// Failure is how a request that got no answer ended, as its client hears
// it: the payload of its rejected or error event (events.Failure is this
// type) and the body of a refusal at the door.
type Failure struct {
	Reason      string `json:"reason"`
	Message     string `json:"message"`
	RetryAfterS int    `json:"retry_after_s,omitempty"`
}

// RetryAfterSeconds is a Retry-After (and retry_after_s) in whole seconds:
// rounded up, so a client never comes back before it may, and at least 1,
// since a client told 0 would retry at once.
func RetryAfterSeconds(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}

// Refused is the failure of a request turned away for reason, a client
// may retry after retryAfter: its reason, the message for that reason
// and the retry advice rounded by RetryAfterSeconds. The door and the
// workflow both end requests with it, so a client reads one message for
// one reason whoever refused it.
func Refused(reason string, retryAfter time.Duration) Failure {
	secs := RetryAfterSeconds(retryAfter)
	return Failure{Reason: reason, Message: refusalMessage(reason, secs), RetryAfterS: secs}
}

// Unreachable is the failure of a request of a class that refuses late
// requests (ReasonDeadlineUnreachable), which could no longer get a
// permit within its class's TTFT SLO ttft: ahead is the wait estimated
// ahead of it when that is what said so, 0 when its deadline came while
// it waited. The client may retry after retryAfter, when the queue ahead
// should have drained.
func Unreachable(class string, ttft, ahead, retryAfter time.Duration) Failure {
	secs := RetryAfterSeconds(retryAfter)
	why := fmt.Sprintf("it waited until its deadline, the %s class's time to first token of %v, without a permit", class, ttft)
	if ahead > 0 {
		why = fmt.Sprintf("about %v of waiting is ahead of it, more than is left of its deadline, the %s class's time to first token of %v",
			ahead.Round(100*time.Millisecond), class, ttft)
	}
	return Failure{Reason: ReasonDeadlineUnreachable, RetryAfterS: secs,
		Message: fmt.Sprintf("Your request could not be served in time: %s. Please retry in %d s, or ask for a class without a deadline.", why, secs)}
}

// refusalMessage is what a client turned away for reason reads.
func refusalMessage(reason string, secs int) string {
	switch reason {
	case ReasonQueueTimeout:
		return "The service is busy and your request waited too long in the queue. Please retry in a moment."
	case ReasonQueueFull:
		return "The service is at capacity and its queue is full. Please retry shortly."
	case ReasonTenantQueueFull:
		return "Your organisation already has as many requests waiting as its plan allows. Please retry when some have finished."
	case ReasonShed:
		return "The service is overloaded and dropped waiting requests of your plan. Please retry in a little while."
	case ReasonUnavailable:
		return fmt.Sprintf("A service Sluice depends on was unavailable. Please retry in %d s.", secs)
	case ReasonBackendUnavailable:
		return fmt.Sprintf("The language model service is unavailable right now. Please retry in %d s.", secs)
	case ReasonTooManyConnections:
		return fmt.Sprintf("Too many connections are open from your address. Please close some or retry in %d s.", secs)
	case ReasonConnectionsFull:
		return fmt.Sprintf("The service has as many connections open as it can take. Please retry in %d s.", secs)
	}
	return fmt.Sprintf("The request could not be served (%s). Please retry in %d s.", reason, secs)
}
