package settle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"

	"github.com/sluice-dev/sluice/activities"
	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/limiter"
	sreq "github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/workflows"
)

// Accounts checks, after a run, that every token reservation was settled
// exactly once. The tenants it checks must be on a tier whose buckets
// refill so slowly (e.g. 0.001 a minute) that what a bucket lacks after
// the run is, to the token, what the tenant's requests were billed.
type Accounts struct {
	// KeptChargeIsNoLoss: a request that kept its whole charge (its
	// workflow could not tell what its failed stream consumed, so it
	// refunded nothing) is not counted as lost; Kept lists them. Set it
	// where a fault is expected to cut streams in a way nobody can
	// account for (a Redis master crashing mid-stream).
	KeptChargeIsNoLoss bool
	// Kept is filled by Leftovers: the requests that kept their charge.
	Kept []string

	TC        client.Client
	RDB       redis.UniversalClient
	Namespace string
	KeyPrefix string
	// The tenants' bucket sizes (their tier's burst).
	TokenCapacity, RequestCapacity float64
}

// How a reservation was settled is checked against the one record that
// says what a request consumed: its workflow's history (the answer's
// usage, or the usage a failed stream reported with its error). The
// tenant's buckets must then lack exactly what its requests were billed:
// a refund missed, doubled or of the wrong amount shows as a difference.

// bill is what one request was billed: the tokens and requests it
// consumed, or, when its workflow gave nothing back, its whole charge.
type bill struct {
	tokens, requests float64
	// unrefunded: the request's workflow kept the whole charge (it did
	// not say what its stream consumed), so Finalize refunded nothing;
	// why says how its stream ended.
	unrefunded bool
	why        string
}

// billOf reads a finished request's history and returns what it was
// billed.
func (a *Accounts) billOf(ctx context.Context, id, tenant string) (bill, error) {
	it := a.TC.GetWorkflowHistory(ctx, workflows.ChatWorkflowID(id), "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	dc := converter.GetDefaultDataConverter()
	var in workflows.ChatInput
	var res *workflows.ChatResult
	var streamScheduled int64
	var streamEnd *historypb.HistoryEvent
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			return bill{}, fmt.Errorf("read history of %s: %w", id, err)
		}
		switch ev.GetEventType() {
		case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
			if err := dc.FromPayloads(ev.GetWorkflowExecutionStartedEventAttributes().GetInput(), &in); err != nil {
				return bill{}, fmt.Errorf("decode input of %s: %w", id, err)
			}
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
			if ev.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName() == "StreamLLM" {
				streamScheduled, streamEnd = ev.GetEventId(), nil
			}
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, enumspb.EVENT_TYPE_ACTIVITY_TASK_FAILED,
			enumspb.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT, enumspb.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
			if scheduledOf(ev) == streamScheduled {
				streamEnd = ev
			}
		case enumspb.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
			var r workflows.ChatResult
			if err := dc.FromPayloads(ev.GetWorkflowExecutionCompletedEventAttributes().GetResult(), &r); err != nil {
				return bill{}, fmt.Errorf("decode result of %s: %w", id, err)
			}
			res = &r
		}
	}
	if res == nil {
		return bill{}, fmt.Errorf("%s has not completed", id)
	}
	if res.Outcome == sreq.OutcomeDone {
		return bill{tokens: float64(res.Usage.TotalTokens), requests: 1}, nil
	}
	if streamScheduled == 0 {
		// It never reached the LLM: nothing consumed.
		return bill{}, nil
	}
	if b, ok := streamBill(streamEnd); ok {
		return b, nil
	}
	tokens, requests := chargedTo(in.RateReservation, tenant)
	why := fmt.Sprintf("%s: StreamLLM ended %s after %d tokens", id, strings.TrimPrefix(streamEnd.GetEventType().String(), "ActivityTask"), a.tokensStreamed(ctx, id))
	if f := streamEnd.GetActivityTaskFailedEventAttributes().GetFailure(); f != nil {
		why += fmt.Sprintf(" (%s %q)", f.GetApplicationFailureInfo().GetType(), f.GetMessage())
	}
	return bill{tokens: tokens, requests: requests, unrefunded: true, why: why}, nil
}

// tokensStreamed counts the token events in a request's event stream.
func (a *Accounts) tokensStreamed(ctx context.Context, id string) int {
	entries, err := a.RDB.XRange(ctx, events.NewLog(a.RDB, events.LogOptions{KeyPrefix: a.KeyPrefix}).Key(id), "-", "+").Result()
	if err != nil {
		return -1
	}
	n := 0
	for _, e := range entries {
		if e.Values["t"] == events.TypeToken {
			n++
		}
	}
	return n
}

// scheduledOf is the scheduled event an activity's closing event refers to.
func scheduledOf(ev *historypb.HistoryEvent) int64 {
	switch {
	case ev.GetActivityTaskCompletedEventAttributes() != nil:
		return ev.GetActivityTaskCompletedEventAttributes().GetScheduledEventId()
	case ev.GetActivityTaskFailedEventAttributes() != nil:
		return ev.GetActivityTaskFailedEventAttributes().GetScheduledEventId()
	case ev.GetActivityTaskTimedOutEventAttributes() != nil:
		return ev.GetActivityTaskTimedOutEventAttributes().GetScheduledEventId()
	case ev.GetActivityTaskCanceledEventAttributes() != nil:
		return ev.GetActivityTaskCanceledEventAttributes().GetScheduledEventId()
	}
	return -1
}

// streamBill reads what a failed stream reported it consumed, as the
// workflow does for its refund; ok is false when it reported nothing
// (timed out, cancelled by Temporal), and then nothing is refunded.
func streamBill(end *historypb.HistoryEvent) (bill, bool) {
	fail := end.GetActivityTaskFailedEventAttributes().GetFailure()
	for fail != nil && fail.GetApplicationFailureInfo() == nil {
		fail = fail.GetCause()
	}
	info := fail.GetApplicationFailureInfo()
	if info == nil {
		return bill{}, false
	}
	if info.GetType() == activities.ErrTypeBackendUnavailable {
		return bill{}, true
	}
	if len(info.GetDetails().GetPayloads()) == 0 {
		// Failures before the first token: nothing consumed.
		switch info.GetType() {
		case activities.ErrTypeBackend, activities.ErrTypeBadRequest, activities.ErrTypePermitLost:
			return bill{}, true
		}
		return bill{}, false
	}
	var u events.Usage
	if err := converter.GetDefaultDataConverter().FromPayloads(info.GetDetails(), &u); err != nil {
		return bill{}, false
	}
	b := bill{tokens: float64(u.TotalTokens)}
	if u.TotalTokens > 0 {
		b.requests = 1
	}
	return b, true
}

// chargedTo is what a reservation charged the tenant's token and request
// buckets (lines "<capacity> <rate> <cost> <t|r> <key>").
func chargedTo(reservation, tenant string) (tokens, requests float64) {
	for _, line := range strings.Split(reservation, "\n") {
		f := strings.SplitN(line, " ", 5)
		if len(f) != 5 || !strings.Contains(f[4], ":tenant:"+tenant+":") {
			continue
		}
		cost, _ := strconv.ParseFloat(f[2], 64)
		if f[3] == "t" {
			tokens += cost
		} else {
			requests += cost
		}
	}
	return tokens, requests
}

// accounts is a tenant's billing after a run.
type accounts struct {
	requests   int
	billed     bill
	unrefunded []string
}

// tenantAccounts bills every chat request the tenant started (the
// visibility store lists them, those whose client left before it learnt
// the id included).
func (a *Accounts) tenant(ctx context.Context, tenant string) (accounts, error) {
	ids, err := a.ListChats(ctx, fmt.Sprintf("SluiceTenant = '%s'", tenant))
	if err != nil {
		return accounts{}, err
	}
	var mu sync.Mutex
	var acc accounts
	var errs []error
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			b, err := a.billOf(ctx, id, tenant)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			acc.requests++
			acc.billed.tokens += b.tokens
			acc.billed.requests += b.requests
			if b.unrefunded {
				acc.unrefunded = append(acc.unrefunded, b.why)
			}
		}()
	}
	wg.Wait()
	return acc, errors.Join(errs...)
}

// listChats lists the ids of the chat workflows matching a condition.
func (a *Accounts) ListChats(ctx context.Context, where string) ([]string, error) {
	q := fmt.Sprintf("WorkflowType = '%s' AND %s", workflows.ChatWorkflowName, where)
	var ids []string
	var token []byte
	for {
		resp, err := a.TC.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Namespace: a.Namespace, Query: q, PageSize: 1000, NextPageToken: token,
		})
		if err != nil {
			return nil, fmt.Errorf("list chat workflows (%s): %w", q, err)
		}
		for _, e := range resp.GetExecutions() {
			ids = append(ids, e.GetExecution().GetWorkflowId())
		}
		if token = resp.GetNextPageToken(); len(token) == 0 {
			return ids, nil
		}
	}
}

// bucketGap is how far each of the tenant's buckets is from capacity
// minus what was billed: 0 when every reservation was settled exactly
// once. A positive gap is charge that never came back.
func (a *Accounts) bucketGap(ctx context.Context, tenant string, billed bill) (tokens, requests float64, err error) {
	level := func(kind string, capacity float64) (float64, error) {
		raw, err := a.RDB.Get(ctx, a.KeyPrefix+"rl3:{t:"+tenant+"}:tenant:"+tenant+":"+kind).Result()
		if errors.Is(err, redis.Nil) {
			return capacity, nil
		}
		if err != nil {
			return 0, fmt.Errorf("read %s bucket of %s: %w", kind, tenant, err)
		}
		l, ok := limiter.StoredLevel(raw)
		if !ok {
			return 0, fmt.Errorf("%s bucket of %s: not a bucket state", kind, tenant)
		}
		return l, nil
	}
	lt, err := level("tokens", a.TokenCapacity)
	if err != nil {
		return 0, 0, err
	}
	lr, err := level("requests", a.RequestCapacity)
	if err != nil {
		return 0, 0, err
	}
	return round3(a.TokenCapacity - billed.tokens - lt), round3(a.RequestCapacity - billed.requests - lr), nil
}

// reservationsLeft counts reservations never refunded: fields still in
// the limiter's reservation hashes.
func (a *Accounts) ReservationsLeft(ctx context.Context) (int64, error) {
	var n int64
	iter := a.RDB.Scan(ctx, 0, a.KeyPrefix+"rl3:*:rb:*", 1000).Iterator()
	for iter.Next(ctx) {
		l, err := a.RDB.HLen(ctx, iter.Val()).Result()
		if err != nil {
			return 0, fmt.Errorf("count reservations in %s: %w", iter.Val(), err)
		}
		n += l
	}
	return n, iter.Err()
}

// round3 drops what the slow refill and float arithmetic add (the
// buckets refill 0.001 a minute).
func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// Leftovers checks what Sluice promises to leave behind a fault once its
// requests have ended, waiting up to within for the stack to settle: no
// permit held, no queue entry, no chat workflow running, and every
// reservation of the given tenants refunded exactly once. It returns what
// was lost: empty means nothing.
func (a *Accounts) Leftovers(ctx context.Context, gate *admission.Gate, within time.Duration, tenants ...string) []string {
	var lost []string
	if err := PoolsIdle(ctx, gate, within); err != nil {
		lost = append(lost, err.Error())
	}
	n, err := RunningChats(ctx, a.TC, a.Namespace, within)
	switch {
	case err != nil:
		lost = append(lost, err.Error())
	case n > 0:
		lost = append(lost, fmt.Sprintf("%d chat workflows still running after %s", n, within))
	}
	for _, tenant := range tenants {
		lost = append(lost, a.unsettled(ctx, tenant)...)
	}
	left, err := a.ReservationsLeft(ctx)
	switch {
	case err != nil:
		lost = append(lost, err.Error())
	case left > 0:
		lost = append(lost, fmt.Sprintf("%d reservations never refunded (still in the limiter's hashes)", left))
	}
	return lost
}

// unsettled checks one tenant's reservations against its requests' bills.
// A door refund may still be retried in the background, so a gap is given
// a few seconds to close.
func (a *Accounts) unsettled(ctx context.Context, tenant string) []string {
	acc, err := a.tenant(ctx, tenant)
	if err != nil {
		return []string{fmt.Sprintf("tenant %s: %v", tenant, err)}
	}
	var lost []string
	if a.KeptChargeIsNoLoss {
		a.Kept = append(a.Kept, acc.unrefunded...)
	} else if len(acc.unrefunded) > 0 {
		lost = append(lost, fmt.Sprintf("tenant %s: %d requests kept their whole charge (no refund): %s",
			tenant, len(acc.unrefunded), strings.Join(First(acc.unrefunded, 5), ", ")))
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		gt, gr, err := a.bucketGap(ctx, tenant, acc.billed)
		if err != nil {
			return append(lost, err.Error())
		}
		// The buckets refill so slowly that a settled one is within a
		// hundredth of a token of its bill.
		if math.Abs(gt) < 0.01 && math.Abs(gr) < 0.01 {
			return lost
		}
		if time.Now().After(deadline) {
			return append(lost, fmt.Sprintf("tenant %s (%d requests): buckets lack %.3f tokens and %.3f requests beyond what the requests were billed (negative: refunded more than charged)",
				tenant, acc.requests, gt, gr))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// First is at most the first n of xs, with "…" when some were left out.
func First(xs []string, n int) []string {
	if len(xs) > n {
		return append(xs[:n:n], "…")
	}
	return xs
}
