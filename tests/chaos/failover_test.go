package chaos

import (
	"bufio"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/tests/chatclient"
	"github.com/sluice-dev/sluice/tests/settle"
	"github.com/sluice-dev/sluice/tests/testenv"
	"github.com/sluice-dev/sluice/workflows"
)

// The failover scenario: failoverRequests requests over failoverQuestions
// questions, failoverClients at a time, while both endpoints drop every
// answer's connection at its failoverAt-th token.
const (
	failoverRequests  = 1000
	failoverQuestions = 50
	failoverClients   = 16
	failoverAt        = 20
)

// failoverRequest is the scenario's request: max_tokens above the
// simulator's longest answer, so that every answer ends on its own.
var failoverRequest = chatclient.Request{MaxTokens: 100, Bound: time.Minute}

// testMidStreamFailover breaks every answer mid-stream on whichever
// endpoint serves it; the pool's other endpoint must continue each one so
// that the client sees one stream that ends done, with exactly the text a
// run without faults gives — no token repeated, none missing — billed
// once.
func testMidStreamFailover(t *testing.T) {
	slow(t)
	s := startStack(t, stackOptions{
		simulator: func(c *llmsim.Config) {
			// Two replicas of one model write the same answers.
			c.Seed = 1
			c.AnswerMinTokens, c.AnswerMaxTokens = 40, 80
			// About 240 tokens a second: a thousand answers in a minute or so.
			c.TimeScale = 0.25
		},
		configure: func(cfg *config.Config) {
			for _, p := range []*config.Pool{&cfg.Pools.Short, &cfg.Pools.Long} {
				p.MaxConcurrency = failoverClients
				p.Continuation = config.ContinuationVLLM
				// Every first attempt fails on both endpoints: a breaker
				// would rightly eject them and no request would meet the
				// fault. Here every one must.
				p.Breaker.Failures = 1 << 20
			}
		},
	})
	question := func(i int) chatclient.Request {
		q := failoverRequest
		q.Query = fmt.Sprintf("How does a token bucket refill after burst number %d?", i%failoverQuestions)
		return q
	}
	baseline := s.sendEach(failoverQuestions, failoverClients, question)
	var extra []string
	for i, r := range baseline {
		if r.Terminal != events.TypeDone || r.Tokens <= failoverAt {
			t.Fatalf("fault-free answer %d: %s, %d tokens; want done with more than %d", i, r.Summary(), r.Tokens, failoverAt)
		}
	}
	before := s.failoverCounts(t)
	for i := range s.sims {
		s.setFault(t, i, llmsim.Fault{DieAfterTokens: failoverAt})
	}
	rs := s.sendEach(failoverRequests, failoverClients, question)
	for i := range s.sims {
		s.setFault(t, i, llmsim.Fault{})
	}
	after := s.failoverCounts(t)
	cmp := compareAnswers(rs, baseline)
	extra = append(extra, cmp.problems...)
	resumed := int(after["resumed"] - before["resumed"])
	if resumed != failoverRequests {
		extra = append(extra, fmt.Sprintf("%d failovers resumed, want one a request: %d", resumed, failoverRequests))
	}
	if n := int(after["gaps"] - before["gaps"]); n != resumed {
		extra = append(extra, fmt.Sprintf("%d failover gaps observed, %d failovers resumed", n, resumed))
	}
	for _, outcome := range []string{"failed", "no_endpoint"} {
		if n := int(after[outcome] - before[outcome]); n != 0 {
			extra = append(extra, fmt.Sprintf("%d failovers ended %s", n, outcome))
		}
	}
	gaps, problems := s.failoverRecords(rs, failoverAt)
	extra = append(extra, settle.First(problems, 10)...)
	if testenv.RecordingHistories() && len(rs) > 0 {
		path, n, err := testenv.SaveHistory(context.Background(), s.tc, workflows.ChatWorkflowID(rs[0].ID), "chat_failover")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("recorded %s (%d events)", path, n)
	}
	faultP50, faultP99 := gapPercentiles(rs)
	baseP50, baseP99 := gapPercentiles(baseline)
	notes := fmt.Sprintf("%d requests over %d questions, %d at a time, 16 permits a pool, continuation vllm, both endpoints (one model, the same answers) dropping every answer's connection at its %dth token; "+
		"%d failovers resumed on the other endpoint, 0 failed, each after token %d by its history; against a fault-free run of the same questions: %d tokens repeated, %d missing, %d answers differing, %d billed other completion tokens; "+
		"added latency of a failover (the gateway's gap from the last token before the drop to the continuation's first) p50/p99/max %s/%s/%s; the clients' longest wait between two tokens p50/p99 %s/%s (fault-free %s/%s)",
		failoverRequests, failoverQuestions, failoverClients, failoverAt, resumed, failoverAt, cmp.repeated, cmp.missing, cmp.differing, cmp.misbilled,
		ms(percentile(gaps, 0.5)), ms(percentile(gaps, 0.99)), ms(percentile(gaps, 1)), ms(faultP50), ms(faultP99), ms(baseP50), ms(baseP99))
	s.finishScenario(t, row{fault: fmt.Sprintf("%d mid-stream failures across two backends (connection dropped at token %d, continuation vllm)", failoverRequests, failoverAt),
		recover: percentile(gaps, 0.99), recoverTo: "connection dropped → the continuation's first token, p99 of the gateway's gap", notes: notes},
		rs, extra, tenantLoad)
}

// sendEach sends n requests as tenantLoad, at most clients at once, and
// returns their results in order.
func (s *stack) sendEach(n, clients int, q func(i int) chatclient.Request) []*chatclient.Result {
	rs := make([]*chatclient.Result, n)
	sem := make(chan struct{}, clients)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			rs[i] = s.send(context.Background(), tenantLoad, q(i))
		})
	}
	wg.Wait()
	return rs
}

// answerComparison is how answers given through failovers differ from
// the fault-free ones to the same questions.
type answerComparison struct {
	repeated, missing, differing, misbilled int
	problems                                []string
}

// compareAnswers checks rs[i] against base[i % len(base)]: done, the same
// text token for token, the same completion tokens billed.
func compareAnswers(rs, base []*chatclient.Result) answerComparison {
	var c answerComparison
	note := func(format string, args ...any) {
		if len(c.problems) < 10 {
			c.problems = append(c.problems, fmt.Sprintf(format, args...))
		}
	}
	for i, r := range rs {
		want := base[i%len(base)]
		if r.Terminal != events.TypeDone {
			note("request %d did not end done: %s", i, r.Summary())
			continue
		}
		c.repeated += max(0, r.Tokens-want.Tokens)
		c.missing += max(0, want.Tokens-r.Tokens)
		if r.Answer() != want.Answer() {
			c.differing++
			note("request %d (%s) answered %q, the fault-free run %q", i, r.ID, r.Answer(), want.Answer())
		}
		if r.Completion != want.Completion {
			c.misbilled++
			note("request %d (%s) billed %d completion tokens, the fault-free run %d", i, r.ID, r.Completion, want.Completion)
		}
	}
	if c.repeated+c.missing > 0 {
		note("%d tokens repeated, %d missing", c.repeated, c.missing)
	}
	return c
}

// gapPercentiles are the p50 and p99 of each answer's longest wait
// between two tokens.
func gapPercentiles(rs []*chatclient.Result) (p50, p99 time.Duration) {
	var gaps []time.Duration
	for _, r := range rs {
		if r.Terminal == events.TypeDone {
			gaps = append(gaps, r.MaxGap)
		}
	}
	if len(gaps) == 0 {
		return 0, 0
	}
	slices.Sort(gaps)
	at := func(q float64) time.Duration { return gaps[min(len(gaps)-1, int(q*float64(len(gaps))))] }
	return at(0.50), at(0.99)
}

func ms(d time.Duration) string { return fmt.Sprintf("%d ms", d.Milliseconds()) }

// failoverCounts reads the API's /metrics: the failovers by outcome and
// the gaps observed, summed over pools.
func (s *stack) failoverCounts(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := s.http.Get(s.baseURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(line, "sluice_stream_failovers_total{"):
			for _, outcome := range []string{"resumed", "failed", "no_endpoint"} {
				if strings.Contains(line, `outcome="`+outcome+`"`) {
					out[outcome] += v
				}
			}
		case strings.HasPrefix(line, "sluice_stream_failover_gap_seconds_count{"):
			out["gaps"] += v
		}
	}
	return out
}
