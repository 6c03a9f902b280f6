package vtc

import (
	"context"
	"strings"
	"testing"
)

// The replay's reader counts a token per chunk with text, skips Sluice's
// comments and the finish chunk, and keeps the usage and the route.
func TestReplayReadsAnOpenAIStream(t *testing.T) {
	body := ": accepted\n\n: queued position=3 estimated_wait_ms=1200\n\n" +
		`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"Fair"},"finish_reason":null}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{"content":" queues"},"finish_reason":null}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}],"sluice":{"route":"long"}}` + "\n\n" +
		`data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}` + "\n\n" +
		"data: [DONE]\n\n"
	rp := &Replay{Speed: 4}
	rp.Begin()
	o := rp.read(context.Background(), strings.NewReader(body))
	if o.Kind != Done || o.Tokens != 2 || o.Route != "long" || !o.HasUsage || o.PromptUsage != 12 || o.OutputUsage != 2 {
		t.Errorf("outcome %+v", o)
	}
	if o.First <= 0 || o.Last < o.First {
		t.Errorf("token times %v..%v", o.First, o.Last)
	}
	// An error object ends the stream with its code; a stream that stops
	// short is no answer.
	o = rp.read(context.Background(), strings.NewReader(`data: {"error":{"code":"queue_timeout"}}`+"\n\n"))
	if o.Kind != "error queue_timeout" {
		t.Errorf("error stream: %+v", o)
	}
	o = rp.read(context.Background(), strings.NewReader(`data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}`+"\n\n"))
	if o.Kind != "stream ended without [DONE]" || o.Tokens != 1 {
		t.Errorf("short stream: %+v", o)
	}
}
