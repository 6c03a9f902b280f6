package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/sluice-dev/sluice/pkg/admission"
	"github.com/sluice-dev/sluice/pkg/events"
	"github.com/sluice-dev/sluice/pkg/request"
	"github.com/sluice-dev/sluice/workflows/signal"
)

// openAIClient is the official client, unchanged, pointed at Sluice. No
// retries: a test must see the first answer.
func openAIClient(key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(stack.baseURL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// requestIDOf is the Sluice request behind an OpenAI completion id.
func requestIDOf(t *testing.T, completionID string) string {
	t.Helper()
	id, ok := strings.CutPrefix(completionID, "chatcmpl-")
	if !ok || !strings.HasPrefix(id, "chat-") {
		t.Fatalf("completion id %q is not chatcmpl-<request id>", completionID)
	}
	return id
}

func TestOpenAIClientStreams(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := openAIClient("k-acme")
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: "sluice-rag",
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("You are terse."),
			openai.UserMessage("What is a leased semaphore?"),
			openai.AssistantMessage("A lock with a timeout."),
			openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{openai.TextContentPart("How does a token bucket refill?")}),
		},
		MaxTokens:     openai.Int(40),
		Temperature:   openai.Float(0.2),
		User:          openai.String("alice"),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	defer stream.Close()
	var acc openai.ChatCompletionAccumulator
	chunks := 0
	var sluice map[string]any
	for stream.Next() {
		ch := stream.Current()
		if !acc.AddChunk(ch) {
			t.Fatalf("the accumulator refused chunk %d: %s", chunks, ch.RawJSON())
		}
		if f, ok := ch.JSON.ExtraFields["sluice"]; ok {
			if err := json.Unmarshal([]byte(f.Raw()), &sluice); err != nil {
				t.Fatal(err)
			}
		}
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream after %d chunks: %v", chunks, err)
	}
	if len(acc.Choices) != 1 {
		t.Fatalf("%d choices", len(acc.Choices))
	}
	ch := acc.Choices[0]
	if strings.TrimSpace(ch.Message.Content) == "" || ch.Message.Role != "assistant" || ch.FinishReason != "length" {
		t.Fatalf("accumulated choice %+v", ch)
	}
	// The model that answered, not the alias asked for.
	if acc.Model != stack.cfg.Pools.Short.Model || acc.Usage.CompletionTokens < 1 || acc.Usage.PromptTokens < 50 ||
		acc.Usage.TotalTokens != acc.Usage.PromptTokens+acc.Usage.CompletionTokens {
		t.Fatalf("model %q usage %+v", acc.Model, acc.Usage)
	}
	// One chunk per token, plus the finish and usage chunks: the answer
	// is cut at max_tokens, which finish_reason says; the native API's
	// truncation notice is not OpenAI content.
	if strings.Contains(ch.Message.Content, stack.cfg.LLM.TruncationNotice) {
		t.Fatalf("a cut answer ends %q", ch.Message.Content)
	}
	if int64(chunks) != acc.Usage.CompletionTokens+2 {
		t.Fatalf("%d chunks for %d completion tokens", chunks, acc.Usage.CompletionTokens)
	}
	id := requestIDOf(t, acc.ID)
	if sluice["request_id"] != id || sluice["route"] != "short" {
		t.Fatalf("sluice extension %v", sluice)
	}
	// The same workflow as /v1/chat retrieved for the last user message
	// and kept the whole conversation.
	if in := chatInput(t, id); in.Query != "How does a token bucket refill?" || len(in.Conversation) != 4 || in.Gateway ||
		in.MaxTokens != 40 || in.Tenant != "acme" {
		t.Fatalf("workflow input %+v", in)
	}
	if r := result(t, id); r.Outcome != request.OutcomeDone {
		t.Fatalf("outcome %q", r.Outcome)
	}
	recordHistory(t, id, "chat_rag_conversation")
	assertPoolsIdle(t)
}

func TestOpenAIClientCompletes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := openAIClient("k-acme")
	var resp *http.Response
	c, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:               "sluice-rag",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.DeveloperMessage("Cite sources."), openai.UserMessage("What is weighted fair queuing?")},
		MaxCompletionTokens: openai.Int(30),
		N:                   openai.Int(1),
	}, option.WithHeader("X-Sluice-KB", stack.cfg.Retrieval.DefaultKB), option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Choices) != 1 || c.Object != "chat.completion" || c.Model != stack.cfg.Pools.Short.Model || c.Created == 0 {
		t.Fatalf("completion %s", c.RawJSON())
	}
	ch := c.Choices[0]
	if strings.TrimSpace(ch.Message.Content) == "" || ch.Message.Role != "assistant" || ch.FinishReason != "length" || ch.Index != 0 {
		t.Fatalf("choice %s", ch.RawJSON())
	}
	if c.Usage.CompletionTokens < 1 || c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens {
		t.Fatalf("usage %s", c.Usage.RawJSON())
	}
	id := requestIDOf(t, c.ID)
	if resp.Header.Get("X-Request-ID") != id {
		t.Fatalf("X-Request-ID %q, completion %q", resp.Header.Get("X-Request-ID"), c.ID)
	}
	if !strings.Contains(c.JSON.ExtraFields["sluice"].Raw(), `"route":"short"`) {
		t.Fatalf("sluice extension missing: %s", c.RawJSON())
	}
	if in := chatInput(t, id); in.MaxTokens != 30 || in.KB != stack.cfg.Retrieval.DefaultKB {
		t.Fatalf("workflow input %+v", in)
	}
	if r := result(t, id); r.Outcome != request.OutcomeDone {
		t.Fatalf("outcome %q", r.Outcome)
	}
	assertPoolsIdle(t)

	// A refusal is an error the client decodes.
	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "sluice-sim", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, N: openai.Int(9),
	})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Code != "invalid_value" || apiErr.Param != "n" || apiErr.Type != "invalid_request_error" {
		t.Fatalf("n=9: %v", err)
	}
}

// The stream read the way OpenAI clients read it, byte for byte: only
// "data: " lines count, SSE comments (here the queue position) are
// skipped, and "data: [DONE]" ends it.
func TestOpenAIRawStreamShowsQueueAsComments(t *testing.T) {
	holders := holdShortPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body := `{"model":"sluice-rag","messages":[{"role":"user","content":"How do leases protect against crashed holders?"}],"max_tokens":20,"stream":true,"temperature":1,"top_p":1}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, stack.baseURL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	id := resp.Header.Get("X-Request-ID")
	sc := bufio.NewScanner(resp.Body)
	var comments, datas []string
	released, done := false, false
	for !done && sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, ":"):
			comments = append(comments, line)
			if strings.HasPrefix(line, ": queued position=1 ") && !released {
				// Queued: give it a permit the way a finishing request does.
				rel, err := stack.gate.Release(ctx, "short", holders[0])
				if err != nil || len(admission.IDs(rel.Woken)) != 1 || admission.IDs(rel.Woken)[0] != id {
					t.Fatalf("release: %+v %v", rel, err)
				}
				if err := admission.Wake(ctx, stack.gate, signal.Notifier{Client: stack.temporal}, rel.Woken); err != nil {
					t.Fatal(err)
				}
				released = true
			}
		case line == "data: [DONE]":
			done = true
		case strings.HasPrefix(line, "data: "):
			datas = append(datas, strings.TrimPrefix(line, "data: "))
		default:
			t.Fatalf("line %q is neither data nor a comment", line)
		}
	}
	if !done || !released {
		t.Fatalf("done %v released %v; comments %q; data %q", done, released, comments, datas)
	}
	if rest, _ := io.ReadAll(resp.Body); strings.TrimSpace(string(rest)) != "" {
		t.Fatalf("after [DONE]: %q", rest)
	}
	if !slices.Contains(comments, ": stage admission") || !slices.Contains(comments, ": stage llm") {
		t.Fatalf("comments %q", comments)
	}
	if len(datas) < 2 {
		t.Fatalf("%d chunks", len(datas))
	}
	var text strings.Builder
	for i, d := range datas {
		var c struct {
			ID      *string         `json:"id"`
			Object  *string         `json:"object"`
			Created *int64          `json:"created"`
			Model   *string         `json:"model"`
			Usage   json.RawMessage `json:"usage"`
			Choices []struct {
				Index *int `json:"index"`
				Delta *struct {
					Role    *string `json:"role"`
					Content *string `json:"content"`
				} `json:"delta"`
				FinishReason json.RawMessage `json:"finish_reason"`
			} `json:"choices"`
		}
		dec := json.NewDecoder(strings.NewReader(d))
		if err := dec.Decode(&c); err != nil {
			t.Fatalf("chunk %d %s: %v", i, d, err)
		}
		if c.ID == nil || *c.ID != "chatcmpl-"+id || c.Object == nil || *c.Object != "chat.completion.chunk" ||
			c.Created == nil || *c.Created < time.Now().Add(-time.Minute).Unix() || c.Model == nil || *c.Model != stack.cfg.Pools.Short.Model || c.Usage != nil {
			t.Fatalf("chunk %d: %s", i, d)
		}
		if len(c.Choices) != 1 || c.Choices[0].Index == nil || *c.Choices[0].Index != 0 || c.Choices[0].Delta == nil {
			t.Fatalf("chunk %d choices: %s", i, d)
		}
		delta, last := c.Choices[0].Delta, i == len(datas)-1
		if (i == 0) != (delta.Role != nil) || (delta.Role != nil && *delta.Role != "assistant") {
			t.Fatalf("chunk %d role: %s", i, d)
		}
		switch {
		case !last && (string(c.Choices[0].FinishReason) != "null" || delta.Content == nil):
			t.Fatalf("chunk %d: %s", i, d)
		case last && (string(c.Choices[0].FinishReason) != `"length"` || delta.Content != nil):
			t.Fatalf("last chunk: %s", d)
		}
		if delta.Content != nil {
			text.WriteString(*delta.Content)
		}
	}
	if strings.TrimSpace(text.String()) == "" {
		t.Fatal("no answer text")
	}
	if r := result(t, id); r.Outcome != request.OutcomeDone {
		t.Fatalf("outcome %q", r.Outcome)
	}
}

// A non-streaming client that leaves before the answer cancels the
// request, as a streaming one does.
func TestOpenAINonStreamingDisconnectCancels(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := events.NewLog(stack.redis, events.LogOptions{KeyPrefix: keyPrefix})
	before := map[string]bool{}
	keys, err := stack.redis.Keys(ctx, log.StreamPattern()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		before[k] = true
	}
	cctx, leave := context.WithCancel(ctx)
	errc := make(chan error, 1)
	client := openAIClient("k-acme")
	go func() {
		_, err := client.Chat.Completions.New(cctx, openai.ChatCompletionNewParams{
			Model: "sluice-sim", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Explain continuous batching in detail")},
			MaxTokens: openai.Int(1000),
		})
		errc <- err
	}()
	// Tests run one at a time: the new event stream is this request's.
	var key string
	for key == "" {
		if ctx.Err() != nil {
			t.Fatal("the request never started")
		}
		keys, _ := stack.redis.Keys(ctx, log.StreamPattern()).Result()
		for _, k := range keys {
			if !before[k] {
				key = k
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	id, _ := log.RequestID(key)
	// Leave once tokens flow.
	for {
		evs, err := stack.redis.XRange(ctx, key, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		tokens := 0
		for _, e := range evs {
			if e.Values["t"] == "token" {
				tokens++
			}
		}
		if tokens >= 3 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	leave()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client error %v", err)
	}
	if r := result(t, id); r.Outcome != request.OutcomeCancelled {
		t.Fatalf("outcome %q after the client left, want cancelled", r.Outcome)
	}
	assertPoolsIdle(t)
}

// A request turned away from the queue reaches OpenAI clients as an
// error: in the stream as an error object, which the client raises; or,
// not streaming, as a 503 with Retry-After.
func TestOpenAIQueueTimeoutIsAnError(t *testing.T) {
	holdShortPool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := openAIClient("k-acme")
	params := openai.ChatCompletionNewParams{
		Model: "sluice-sim", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("What is weighted fair queuing?")},
		MaxTokens: openai.Int(20),
	}
	streamErr := make(chan error, 1)
	go func() {
		stream := client.Chat.Completions.NewStreaming(ctx, params)
		defer stream.Close()
		for stream.Next() {
			if len(stream.Current().Choices) > 0 {
				streamErr <- errors.New("a chunk from a request that never got a permit")
				return
			}
		}
		streamErr <- stream.Err()
	}()
	var resp *http.Response
	_, err := client.Chat.Completions.New(ctx, params, option.WithResponseInto(&resp))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 || apiErr.Code != request.ReasonQueueTimeout || apiErr.Type != "server_error" ||
		apiErr.Message == "" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("not streaming: %v", err)
	}
	err = <-streamErr
	var se *ssestream.StreamError
	if !errors.As(err, &se) || !strings.Contains(string(se.Event.Data), `"code":"queue_timeout"`) {
		t.Fatalf("streaming: %v", err)
	}
}
