package llm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/openai"
)

// collect streams req and returns the text the caller got, piece by
// piece.
func collect(t *testing.T, c *OpenAI, req Request) ([]string, Result, error) {
	t.Helper()
	var pieces []string
	res, err := c.Stream(context.Background(), req, func(d Delta) error {
		pieces = append(pieces, d.Text)
		return nil
	})
	return pieces, res, err
}

// uninterrupted is the answer a healthy endpoint gives req.
func uninterrupted(t *testing.T, req Request) []string {
	t.Helper()
	_, url := simulator(t, llmsim.Fault{})
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{url}})
	pieces, res, err := collect(t, c, req)
	if err != nil || res.Usage.CompletionTokens != len(pieces) {
		t.Fatalf("uninterrupted answer: %v, %d pieces, usage %+v", err, len(pieces), res.Usage)
	}
	return pieces
}

// Endpoints that drop the connection at the answer's 10th and 25th token
// (each continuation starting past its own endpoint's fault): the caller
// gets one answer, piece for piece the uninterrupted one, with two
// failovers recorded.
func TestFailoverContinuesWithoutRepeatOrLoss(t *testing.T) {
	req := simRequest(60)
	want := uninterrupted(t, req)
	_, a := simulator(t, llmsim.Fault{DieAfterTokens: 10})
	_, b := simulator(t, llmsim.Fault{DieAfterTokens: 25})
	_, healthy := simulator(t, llmsim.Fault{})
	c, err := NewOpenAI(OpenAIOptions{Endpoints: []string{a, b, healthy}, Continuation: ContinuationVLLM, MaxFailovers: 2})
	if err != nil {
		t.Fatal(err)
	}
	got, res, err := collect(t, c, req)
	if err != nil {
		t.Fatalf("stream with failovers: %v (failovers %+v)", err, res.Failovers)
	}
	if strings.Join(got, "") != strings.Join(want, "") || len(got) != len(want) {
		t.Fatalf("got %d pieces %q\nwant %d %q", len(got), strings.Join(got, ""), len(want), strings.Join(want, ""))
	}
	if res.Chunks != len(want) || res.UsageReported || res.FinishReason != "stop" {
		t.Errorf("result %+v: want %d chunks, usage left to the caller, finish stop", res, len(want))
	}
	if len(res.Failovers) != 2 {
		t.Fatalf("failovers %+v, want 2", res.Failovers)
	}
	f0, f1 := res.Failovers[0], res.Failovers[1]
	if f0.From != "endpoint-0" || f0.To != "endpoint-1" || f0.AfterTokens != 10 || f0.Reason != "broken" || f0.Outcome != FailoverResumed {
		t.Errorf("first failover %+v", f0)
	}
	if f1.From != "endpoint-1" || f1.To != "endpoint-2" || f1.AfterTokens != 25 || f1.Outcome != FailoverResumed || f1.Gap <= 0 || f1.PromptTokens == 0 {
		t.Errorf("second failover %+v", f1)
	}
}

// A pool whose backend cannot continue keeps the interrupted answer, and
// so does a stream that has used its failovers.
func TestFailoverOnlyWhereAllowed(t *testing.T) {
	_, a := simulator(t, llmsim.Fault{DieAfterTokens: 10})
	_, b := simulator(t, llmsim.Fault{DieAfterTokens: 20})
	for name, opts := range map[string]OpenAIOptions{
		"continuation none":      {Endpoints: []string{a, b}},
		"failovers used":         {Endpoints: []string{a, b}, Continuation: ContinuationVLLM, MaxFailovers: 1},
		"no other endpoint left": {Endpoints: []string{a}, Continuation: ContinuationVLLM},
	} {
		c, err := NewOpenAI(opts)
		if err != nil {
			t.Fatal(err)
		}
		got, res, err := collect(t, c, simRequest(60))
		var e *Error
		if !errors.As(err, &e) || e.Retryable || len(got) == 0 {
			t.Errorf("%s: %d pieces, err %v; want a non-retryable break after tokens", name, len(got), err)
		}
		switch name {
		case "failovers used":
			if len(res.Failovers) != 1 || len(got) != 20 {
				t.Errorf("%s: %d pieces, failovers %+v; want 20 and one", name, len(got), res.Failovers)
			}
		case "no other endpoint left":
			if len(res.Failovers) != 1 || res.Failovers[0].Outcome != FailoverNoEndpoint {
				t.Errorf("%s: failovers %+v", name, res.Failovers)
			}
		default:
			if len(res.Failovers) != 0 {
				t.Errorf("%s: failovers %+v", name, res.Failovers)
			}
		}
	}
}

// The caller stopping the stream is not an endpoint's failure.
func TestNoFailoverForTheCallersStop(t *testing.T) {
	_, a := simulator(t, llmsim.Fault{})
	_, b := simulator(t, llmsim.Fault{})
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{a, b}, Continuation: ContinuationVLLM})
	stop := errors.New("stop")
	n := 0
	res, err := c.Stream(context.Background(), simRequest(40), func(Delta) error {
		if n++; n == 5 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || len(res.Failovers) != 0 {
		t.Fatalf("err %v, failovers %+v", err, res.Failovers)
	}
}

// A stall mid-answer fails over once the token-idle deadline passes.
func TestFailoverAfterStall(t *testing.T) {
	req := simRequest(30)
	want := uninterrupted(t, req)
	_, a := simulator(t, llmsim.Fault{StallAfterTokens: 8})
	_, b := simulator(t, llmsim.Fault{})
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{a, b}, Continuation: ContinuationVLLM,
		Deadlines: Deadlines{TokenIdle: 200 * time.Millisecond}})
	got, res, err := collect(t, c, req)
	if err != nil || strings.Join(got, "") != strings.Join(want, "") {
		t.Fatalf("err %v, got %q want %q", err, strings.Join(got, ""), strings.Join(want, ""))
	}
	if len(res.Failovers) != 1 || res.Failovers[0].Reason != DeadlineTokenIdle || res.Failovers[0].Gap < 200*time.Millisecond {
		t.Fatalf("failovers %+v", res.Failovers)
	}
}

func TestContinuationOptionChecked(t *testing.T) {
	if _, err := NewOpenAI(OpenAIOptions{Endpoints: []string{"http://x"}, Continuation: "tgi"}); err == nil {
		t.Fatal("an unknown continuation was taken")
	}
}

// breaksAfter is a backend that streams pieces, then an error event: a
// server failing mid-answer.
func breaksAfter(t *testing.T, pieces ...string) string {
	return sseServer(t, func(w http.ResponseWriter, _ openai.ChatRequest) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, p := range pieces {
			fmt.Fprintf(w, `data: {"choices":[{"index":0,"delta":{"content":%q},"finish_reason":null}]}`+"\n\n", p)
		}
		fmt.Fprint(w, `data: {"error":{"message":"engine died","type":"server_error"}}`+"\n\n")
	}).URL
}

// The continuation request is vLLM's: the conversation, the text so far
// as the final assistant message, both switches, the budget left. A
// backend that refuses it (400) ends the answer interrupted.
func TestFailoverRequest(t *testing.T) {
	var got openai.ChatRequest
	continues := sseServer(t, func(w http.ResponseWriter, req openai.ChatRequest) {
		got = req
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"content":" world"},"finish_reason":"stop"}]}`+"\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{breaksAfter(t, "Hel", "lo"), continues.URL}, Continuation: ContinuationVLLM})
	req := Request{Model: "m", MaxTokens: 10, Messages: []openai.Message{openai.TextMessage("user", "hi")}}
	pieces, res, err := collect(t, c, req)
	if err != nil || strings.Join(pieces, "") != "Hello world" || res.FinishReason != "stop" {
		t.Fatalf("pieces %q, %+v, %v", pieces, res, err)
	}
	last := got.Messages[len(got.Messages)-1]
	text, _ := last.Text()
	if len(got.Messages) != 2 || last.Role != openai.RoleAssistant || text != "Hello" || !got.ContinueFinalMessage ||
		got.AddGenerationPrompt == nil || *got.AddGenerationPrompt || got.MaxTokens == nil || *got.MaxTokens != 8 {
		t.Fatalf("continuation request %+v, last message %q", got, text)
	}

	refuses := sseServer(t, func(w http.ResponseWriter, _ openai.ChatRequest) {
		http.Error(w, `{"error":{"message":"unknown field continue_final_message"}}`, http.StatusBadRequest)
	})
	c, _ = NewOpenAI(OpenAIOptions{Endpoints: []string{breaksAfter(t, "Hel", "lo"), refuses.URL}, Continuation: ContinuationVLLM})
	pieces, res, err = collect(t, c, req)
	var e *Error
	if !errors.As(err, &e) || e.Status != http.StatusBadRequest || len(pieces) != 2 {
		t.Fatalf("pieces %q, err %v; want the 400 after the 2 pieces", pieces, err)
	}
	if len(res.Failovers) != 1 || res.Failovers[0].Outcome != FailoverFailed || res.Failovers[0].Reason != "broken" {
		t.Fatalf("failovers %+v", res.Failovers)
	}
}

// A stream that resumes an answer continues it from the caller's text,
// and only on a pool whose backend can.
func TestStreamResume(t *testing.T) {
	req := simRequest(40)
	want := uninterrupted(t, req)
	_, url := simulator(t, llmsim.Fault{})
	c, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{url}, Continuation: ContinuationVLLM})
	req.Resume = &Resume{Text: strings.Join(want[:9], ""), Pieces: 9}
	got, res, err := collect(t, c, req)
	if err != nil || strings.Join(want[:9], "")+strings.Join(got, "") != strings.Join(want, "") {
		t.Fatalf("err %v, resumed with %q, want %q", err, strings.Join(got, ""), strings.Join(want[9:], ""))
	}
	if res.Chunks != len(want) || res.UsageReported {
		t.Fatalf("result %+v, want %d chunks counted from the resumed 9, usage left to the caller", res, len(want))
	}
	none, _ := NewOpenAI(OpenAIOptions{Endpoints: []string{url}})
	if _, err := none.Stream(context.Background(), req, func(Delta) error { return nil }); !errors.Is(err, ErrCannotResume) {
		t.Fatalf("resume on a pool that cannot continue: %v", err)
	}
}
