package openai

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/sluice-dev/sluice/api/httpio"
	"github.com/sluice-dev/sluice/pkg/answer"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/openai"
	"github.com/sluice-dev/sluice/pkg/refusal"
	"github.com/sluice-dev/sluice/pkg/request"
)

// completionChunk is one OpenAI streaming chunk with Sluice's extension,
// which only the finish chunk carries.
type completionChunk struct {
	openai.Chunk
	Sluice *sluiceInfo `json:"sluice,omitempty"`
}

// chunkSink renders events as OpenAI chunks. Events that OpenAI has no
// chunk for (accepted, queue, stage) become SSE comments, which OpenAI
// parsers skip and a curious reader can see.
type chunkSink struct {
	out          httpio.SSEWriter
	meta         completionMeta
	includeUsage bool
	// roleSent marks the choices whose chunk carried the assistant role,
	// which OpenAI sends on a choice's first chunk only.
	roleSent []bool
}

func (k *chunkSink) Write(ev events.Event) error {
	switch ev.Type {
	case events.TypeAccepted:
		k.meta.ServiceTier = answer.ServiceTierOf(ev)
		return k.comment("accepted")
	case events.TypeQueue:
		var q events.Queue
		if json.Unmarshal(ev.Data, &q) != nil {
			return nil
		}
		return k.comment(fmt.Sprintf("queued position=%d estimated_wait_ms=%d", q.Position, q.EstimatedWaitMs))
	case events.TypeStage:
		var sg events.Stage
		if json.Unmarshal(ev.Data, &sg) != nil {
			return nil
		}
		return k.comment("stage " + sg.Stage)
	case events.TypeToken:
		var t events.Token
		if json.Unmarshal(ev.Data, &t) != nil || t.Notice {
			// A notice is Sluice's, not the model's: OpenAI's content is
			// the model's text as sent (finish_reason says it was cut).
			return nil
		}
		if t.Model != "" {
			// The first token names the model that answers; every chunk
			// repeats it.
			k.meta.Model = t.Model
		}
		delta := openai.Delta{ToolCalls: t.ToolCalls}
		if t.Text != "" || len(t.ToolCalls) == 0 {
			delta.Content = &t.Text
		}
		if !validChoice(t.Choice) {
			return nil
		}
		return k.data(k.chunk(t.Choice, delta, nil))
	case events.TypeDone:
		var d events.Done
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			return k.fail(&refusal.Error{Class: refusal.Internal, Code: request.ReasonInternal, Message: "unreadable answer"})
		}
		if len(k.roleSent) == 0 && d.Model != "" {
			// An empty answer: no token named the model.
			k.meta.Model = d.Model
		}
		if err := k.finish(d); err != nil {
			return err
		}
		if k.includeUsage {
			if err := k.data(openai.Chunk{Header: k.meta.header(openai.ObjectChatCompletionChunk),
				Choices: []openai.ChunkChoice{}, Usage: openai.Of(usageOf(d.Usage))}); err != nil {
				return err
			}
		}
		return k.out.Printf("data: [DONE]\n\n")
	case events.TypeRejected, events.TypeError:
		return k.fail(answer.Failure(ev))
	}
	return nil
}

// finish sends each choice's last chunk, with its finish reason; the last
// of them carries Sluice's extension.
func (k *chunkSink) finish(d events.Done) error {
	finishes := finishReasons(d)
	for i, reason := range finishes {
		fr := answer.FinishReason(reason)
		last := k.chunk(i, openai.Delta{}, &fr)
		if last.Choices[0].Delta.Role != "" {
			// An empty answer: its only chunk still says who speaks.
			empty := ""
			last.Choices[0].Delta.Content = &empty
		}
		if i == len(finishes)-1 {
			last.Sluice = sluiceOf(d)
		}
		if err := k.data(last); err != nil {
			return err
		}
	}
	return nil
}

// chunk is the next chunk of a choice, with the role on its first. Usage
// is null on it when the client asked for usage, which the last chunk
// carries.
func (k *chunkSink) chunk(choice int, delta openai.Delta, finish *string) completionChunk {
	for len(k.roleSent) <= choice {
		k.roleSent = append(k.roleSent, false)
	}
	if !k.roleSent[choice] {
		delta.Role, k.roleSent[choice] = "assistant", true
	}
	ch := openai.Chunk{Header: k.meta.header(openai.ObjectChatCompletionChunk),
		Choices: []openai.ChunkChoice{{Index: choice, Delta: delta, Logprobs: openai.Null[json.RawMessage](), FinishReason: finish}}}
	if k.includeUsage {
		ch.Usage = openai.Null[openai.Usage]()
	}
	return completionChunk{Chunk: ch}
}

// fail ends the stream with an error object, which OpenAI clients raise
// as an error (openai-go: ssestream.StreamError). No [DONE] follows.
func (k *chunkSink) fail(e *refusal.Error) error {
	return k.data(ErrorBody(e))
}

func (k *chunkSink) data(v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode chunk: %w", err)
	}
	return k.out.Printf("data: %s\n\n", raw)
}

func (k *chunkSink) comment(text string) error {
	return k.out.Printf(": %s\n\n", text)
}

func (k *chunkSink) KeepAlive() error { return k.comment("keep-alive") }

func (k *chunkSink) Flush() error { return k.out.Flush() }

// answerCollector gathers a request's answers for a non-streaming reply.
type answerCollector struct {
	// answers are by choice: one unless the client asked for several.
	answers []*choiceAnswer
	done    events.Done
	failure *refusal.Error
	// serviceTier is the class the accepted event says.
	serviceTier string
}

// choiceAnswer is one choice's answer: its text and the tool calls it
// asks for; callIndex maps a streamed call's index to its place in calls.
type choiceAnswer struct {
	text      strings.Builder
	calls     []openai.ToolCall
	callIndex map[int]int
}

// validChoice bounds the choices a reader keeps, against an event it did
// not expect; the door lets a client ask for at most maxChoices.
func validChoice(i int) bool { return i >= 0 && i < maxChoices }

func (col *answerCollector) Write(ev events.Event) error {
	switch ev.Type {
	case events.TypeAccepted:
		col.serviceTier = answer.ServiceTierOf(ev)
	case events.TypeToken:
		var t events.Token
		if json.Unmarshal(ev.Data, &t) != nil || !validChoice(t.Choice) || t.Notice {
			return nil
		}
		for len(col.answers) <= t.Choice {
			col.answers = append(col.answers, &choiceAnswer{})
		}
		ans := col.answers[t.Choice]
		ans.text.WriteString(t.Text)
		if len(t.ToolCalls) > 0 {
			if ans.callIndex == nil {
				ans.callIndex = map[int]int{}
			}
			ans.calls = openai.AddToolCalls(ans.calls, ans.callIndex, t.ToolCalls)
		}
	case events.TypeDone:
		if err := json.Unmarshal(ev.Data, &col.done); err != nil {
			col.failure = &refusal.Error{Class: refusal.Internal, Code: request.ReasonInternal, Message: "unreadable answer"}
		}
	case events.TypeRejected, events.TypeError:
		col.failure = answer.Failure(ev)
	}
	return nil
}

func (col *answerCollector) KeepAlive() error { return nil }

func (col *answerCollector) Flush() error { return nil }
