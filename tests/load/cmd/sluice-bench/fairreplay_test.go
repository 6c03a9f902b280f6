package main

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
	rp := &replay{speed: 4}
	rp.begin()
	o := rp.read(context.Background(), strings.NewReader(body))
	if o.kind != replayDone || o.tokens != 2 || o.route != "long" || !o.hasUsage || o.promptUsage != 12 || o.outputUsage != 2 {
		t.Errorf("outcome %+v", o)
	}
	if o.first <= 0 || o.last < o.first {
		t.Errorf("token times %v..%v", o.first, o.last)
	}
	// An error object ends the stream with its code; a stream that stops
	// short is no answer.
	o = rp.read(context.Background(), strings.NewReader(`data: {"error":{"code":"queue_timeout"}}`+"\n\n"))
	if o.kind != "error queue_timeout" {
		t.Errorf("error stream: %+v", o)
	}
	o = rp.read(context.Background(), strings.NewReader(`data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}`+"\n\n"))
	if o.kind != "stream ended without [DONE]" || o.tokens != 1 {
		t.Errorf("short stream: %+v", o)
	}
}
