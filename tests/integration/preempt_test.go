package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/request"
)

// flexAnswer is the flex stream's answer in tokens: seconds of decoding
// on the stack's simulator, long enough to be paused mid-answer.
const flexAnswer = 1200

// longConversation is a gateway prompt over the short pool's threshold,
// so that it is routed to the long pool.
var longConversation = strings.Repeat(longQuery+" ", 2)

// A flex stream holding the long pool's one permit is paused for a
// request of a class that refuses late ones, through the whole stack:
// the turnover estimate does not refuse that request (a pause, not the
// turnover, frees its permit), it is answered within its 3 s deadline
// while the flex answer is unfinished, and the flex stream goes on to the
// end of its answer with every token once, as the official client reads
// it. The long pool continues answers (continuation: vllm) and
// preemption is on in this stack.
func TestFlexStreamPausesForARequestThatRefusesLate(t *testing.T) {
	setPoolLimits(t, stack.cfg.Pools.Short.MaxConcurrency, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pausesBefore := counterValue(t, "sluice_admission_pauses_total", map[string]string{"pool": request.PoolLong})

	type flexEnd struct {
		id        string
		tokens    int
		usage     int64
		finished  time.Time
		streamErr error
	}
	started := make(chan string, 1)
	ended := make(chan flexEnd, 1)
	go func() {
		client := openAIClient("k-acme")
		stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:         "sluice-sim",
			Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage(llmsim.AnswerTokensDirective(flexAnswer) + longConversation)},
			MaxTokens:     openai.Int(flexAnswer),
			ServiceTier:   openai.ChatCompletionNewParamsServiceTierFlex,
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		defer stream.Close()
		var end flexEnd
		for stream.Next() {
			ch := stream.Current()
			end.id = ch.ID
			if len(ch.Choices) == 1 && ch.Choices[0].Delta.Content != "" {
				if end.tokens == 0 {
					started <- ch.ID
				}
				end.tokens++
			}
			end.usage = max(end.usage, ch.Usage.CompletionTokens)
		}
		end.finished, end.streamErr = time.Now(), stream.Err()
		ended <- end
	}()
	var flex string
	select {
	case id := <-started:
		flex = requestIDOf(t, id)
	case e := <-ended:
		t.Fatalf("the flex stream ended after %d tokens: %v", e.tokens, e.streamErr)
	case <-ctx.Done():
		t.Fatal("the flex stream did not start")
	}
	// Past its first min_tokens tokens, a keep-alive round offers the
	// stream for a pause (the long pool's pausable hash, beside its
	// permits).
	pausable := strings.TrimSuffix(stack.gate.PermitsKey(request.PoolLong), "permits") + "pausable"
	for !stack.redis.HExists(ctx, pausable, flex).Val() {
		select {
		case e := <-ended:
			t.Fatalf("the flex stream ended after %d tokens, never offered for a pause: %v", e.tokens, e.streamErr)
		case <-ctx.Done():
			t.Fatalf("the flex stream never offered itself for a pause (%s)", pausable)
		case <-time.After(50 * time.Millisecond):
		}
	}

	asked := time.Now()
	urgentClient := openAIClient("k-deadline")
	c, err := urgentClient.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "sluice-sim", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(longConversation)}, MaxTokens: openai.Int(20),
	})
	if err != nil {
		t.Fatalf("the urgent request, asked %v after the flex stream started: %v", time.Since(asked), err)
	}
	urgent := requestIDOf(t, c.ID)
	answered := time.Now()
	if r := result(t, urgent); r.Outcome != request.OutcomeDone || r.Route != request.PoolLong {
		t.Fatalf("urgent request's result %+v, want done on the long pool", r)
	}

	var e flexEnd
	select {
	case e = <-ended:
	case <-ctx.Done():
		t.Fatal("the flex stream did not end")
	}
	if e.streamErr != nil || e.tokens != flexAnswer || e.usage != flexAnswer {
		t.Fatalf("flex stream: %d content chunks, usage %d, %v; want %d each, once", e.tokens, e.usage, e.streamErr, flexAnswer)
	}
	if !e.finished.After(answered) {
		t.Fatal("the flex stream ended before the urgent request was answered: nothing was paused")
	}
	if got := counterValue(t, "sluice_admission_pauses_total", map[string]string{"pool": request.PoolLong}); got < pausesBefore+1 {
		t.Fatalf("pauses on the long pool %v, want at least %v", got, pausesBefore+1)
	}
	if got := requestIDOf(t, e.id); got != flex {
		t.Fatalf("the flex stream's chunks name %s, then %s", flex, got)
	}
	if r := result(t, flex); r.Outcome != request.OutcomeDone || r.Route != request.PoolLong {
		t.Fatalf("flex request's result %+v", r)
	}
	// The urgent request's workflow queued with a stream to pause
	// (AdmitOutput.MayPause), which keeps refuse_late from refusing it.
	recordHistory(t, urgent, "chat_may_pause")
	recordHistory(t, flex, "chat_paused")
	assertPoolsIdle(t)
}

// counterValue is a counter's value on the API's /metrics (0 when the
// series is not there yet).
func counterValue(t *testing.T, family string, labels map[string]string) float64 {
	t.Helper()
	f, ok := scrapeFamilies(t)[family]
	if !ok {
		return 0
	}
	m := findMetric(f, labels)
	if m == nil {
		return 0
	}
	return m.GetCounter().GetValue()
}
