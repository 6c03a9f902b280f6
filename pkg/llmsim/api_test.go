package llmsim_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

func TestStreamFormat(t *testing.T) {
	sim := start(t, testConfig())
	ctx := context.Background()
	const question = "How does continuous batching keep GPU utilisation high?"

	resp, err := post(ctx, sim.client, sim.url+"/v1/chat/completions", map[string]any{
		"model":          "sluice-sim",
		"messages":       userMsg(question),
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
		"temperature":    0.7,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type = %q, want text/event-stream", ct)
	}
	payloads, err := readSSE(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(payloads); n < 5 || payloads[n-1] != "[DONE]" {
		t.Fatalf("want role, content..., finish, usage, [DONE]; got %q", payloads)
	}
	chunks := make([]sseChunk, len(payloads)-1)
	for i, p := range payloads[:len(payloads)-1] {
		if err := json.Unmarshal([]byte(p), &chunks[i]); err != nil {
			t.Fatalf("chunk %d %q: %v", i, p, err)
		}
		c := chunks[i]
		if c.ID != chunks[0].ID || !strings.HasPrefix(c.ID, "chatcmpl-") || c.Object != "chat.completion.chunk" ||
			c.Model != "sluice-sim" || c.Created == 0 {
			t.Errorf("chunk %d header wrong: %s", i, p)
		}
		// With include_usage OpenAI sends "usage":null on all but the last chunk.
		if i < len(chunks)-1 && !strings.Contains(p, `"usage":null`) {
			t.Errorf("chunk %d lacks usage:null: %s", i, p)
		}
	}

	first := chunks[0]
	if len(first.Choices) != 1 || first.Choices[0].Delta.Role != "assistant" ||
		first.Choices[0].Delta.Content == nil || *first.Choices[0].Delta.Content != "" ||
		first.Choices[0].FinishReason != nil {
		t.Errorf("first chunk = %s, want role assistant, empty content, null finish_reason", payloads[0])
	}
	if !strings.Contains(payloads[0], `"finish_reason":null`) {
		t.Errorf("first chunk must carry an explicit null finish_reason: %s", payloads[0])
	}

	finish := chunks[len(chunks)-2]
	if len(finish.Choices) != 1 || finish.Choices[0].FinishReason == nil || *finish.Choices[0].FinishReason != "stop" ||
		!strings.Contains(payloads[len(chunks)-2], `"delta":{}`) {
		t.Errorf("finish chunk = %s, want empty delta and finish_reason stop", payloads[len(chunks)-2])
	}

	last := chunks[len(chunks)-1]
	if last.Usage == nil || len(last.Choices) != 0 || !strings.Contains(payloads[len(chunks)-1], `"choices":[]`) {
		t.Fatalf("usage chunk = %s, want choices [] and usage", payloads[len(chunks)-1])
	}

	var text strings.Builder
	content := chunks[1 : len(chunks)-2]
	for i, c := range content {
		if len(c.Choices) != 1 || c.Choices[0].Delta.Content == nil || *c.Choices[0].Delta.Content == "" ||
			c.Choices[0].Delta.Role != "" || c.Choices[0].FinishReason != nil {
			t.Errorf("content chunk %d = %s", i, payloads[i+1])
			continue
		}
		text.WriteString(*c.Choices[0].Delta.Content)
	}
	counter, err := tokens.For(tokens.CL100K)
	if err != nil {
		t.Fatal(err)
	}
	wantPrompt := counter.CountChat([]tokens.Message{{Role: "user", Content: question}})
	u := *last.Usage
	if u.PromptTokens != wantPrompt || u.CompletionTokens != len(content) || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Errorf("usage = %+v, want prompt %d, completion %d (content chunks)", u, wantPrompt, len(content))
	}
	cfg := testConfig()
	if len(content) < cfg.AnswerMinTokens || len(content) > cfg.AnswerMaxTokens {
		t.Errorf("natural answer has %d tokens, want %d..%d", len(content), cfg.AnswerMinTokens, cfg.AnswerMaxTokens)
	}
	if got := strings.Count(text.String(), " ") + 1; got != len(content) {
		t.Errorf("answer %q has %d words, want one per token (%d)", text.String(), got, len(content))
	}

	// The same request without streaming gives the same answer.
	res, err := sim.chat(ctx, map[string]any{"messages": userMsg(question)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Text != text.String() || res.Finish != "stop" || res.Usage != u {
		t.Errorf("non-streaming = %+v, want text %q, stop, usage %+v", res, text.String(), u)
	}
}

func TestStreamWithoutUsage(t *testing.T) {
	sim := start(t, testConfig())
	resp, err := post(context.Background(), sim.client, sim.url+"/v1/chat/completions", map[string]any{
		"messages": userMsg("hello"), "stream": true, "max_tokens": 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	payloads, err := readSSE(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	// role, 3 tokens, finish, [DONE]
	if len(payloads) != 6 || payloads[5] != "[DONE]" {
		t.Fatalf("got %d payloads %q, want 6", len(payloads), payloads)
	}
	for _, p := range payloads[:5] {
		if strings.Contains(p, "usage") {
			t.Errorf("chunk mentions usage without include_usage: %s", p)
		}
	}
	if !strings.Contains(payloads[4], `"finish_reason":"length"`) {
		t.Errorf("finish chunk = %s, want finish_reason length", payloads[4])
	}
}

func TestNonStreamingCompletion(t *testing.T) {
	sim := start(t, testConfig())
	resp, err := post(context.Background(), sim.client, sim.url+"/v1/chat/completions", map[string]any{
		"messages": []map[string]any{
			{"role": "system", "content": "You are terse."},
			{"role": "user", "content": []map[string]any{{"type": "text", "text": "What is a KV cache?"}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var out struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices []struct {
			Index   int `json:"index"`
			Message struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.ID, "chatcmpl-") || out.Object != "chat.completion" || out.Model != "sluice-sim" ||
		out.Created == 0 || len(out.Choices) != 1 {
		t.Fatalf("completion = %+v", out)
	}
	c := out.Choices[0]
	if c.Message.Role != "assistant" || c.Message.Content == "" || c.FinishReason != "stop" {
		t.Errorf("choice = %+v", c)
	}
	if out.Usage.CompletionTokens != len(strings.Fields(c.Message.Content)) ||
		out.Usage.TotalTokens != out.Usage.PromptTokens+out.Usage.CompletionTokens || out.Usage.PromptTokens < 10 {
		t.Errorf("usage = %+v for %q", out.Usage, c.Message.Content)
	}
}

func TestBadRequests(t *testing.T) {
	cfg := testConfig()
	cfg.KVCacheBlocks = 4
	cfg.BlockSize = 16 // 64-token context
	sim := start(t, cfg)
	cases := map[string]string{
		"bad json":          `{"messages": [`,
		"no messages":       `{"model":"sluice-sim"}`,
		"empty messages":    `{"messages":[]}`,
		"missing role":      `{"messages":[{"content":"hi"}]}`,
		"bad content":       `{"messages":[{"role":"user","content":42}]}`,
		"zero max_tokens":   `{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}`,
		"negative max_comp": `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":-3}`,
		"n=0":               `{"messages":[{"role":"user","content":"hi"}],"n":0}`,
		"n=9":               `{"messages":[{"role":"user","content":"hi"}],"n":9}`,
		"prompt beyond kv":  `{"messages":[{"role":"user","content":"` + strings.Repeat("word ", 80) + `"}]}`,
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			resp, err := sim.client.Post(sim.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatalf("decode error body: %v", err)
			}
			if resp.StatusCode != http.StatusBadRequest || e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
				t.Errorf("got %d %+v, want 400 invalid_request_error", resp.StatusCode, e)
			}
		})
	}
	if st := sim.Stats(); st.Running+st.Waiting != 0 {
		t.Errorf("rejected requests reached the engine: %+v", st)
	}
}

func TestMaxTokensGivesLength(t *testing.T) {
	sim := start(t, testConfig())
	ctx := context.Background()
	for _, field := range []string{"max_tokens", "max_completion_tokens"} {
		res, err := sim.streamChat(ctx, map[string]any{"messages": userMsg("Explain preemption."), field: 7})
		if err != nil {
			t.Fatal(err)
		}
		if res.Finish != "length" || res.Chunks != 7 || res.Usage.CompletionTokens != 7 {
			t.Errorf("%s=7: finish %q, %d chunks, usage %+v; want length, 7, 7", field, res.Finish, res.Chunks, res.Usage)
		}
	}
	// A budget above the natural length ends with stop.
	res, err := sim.streamChat(ctx, map[string]any{"messages": userMsg("Explain preemption."), "max_tokens": 1000})
	if err != nil {
		t.Fatal(err)
	}
	if res.Finish != "stop" || res.Chunks >= 1000 || res.Chunks != res.Usage.CompletionTokens {
		t.Errorf("max_tokens=1000: finish %q, %d chunks, usage %+v", res.Finish, res.Chunks, res.Usage)
	}
}

func TestDeterministicAnswers(t *testing.T) {
	ctx := context.Background()
	a, b := start(t, testConfig()), start(t, testConfig())
	cfg := testConfig()
	cfg.Seed = 99
	other := start(t, cfg)
	body := func() map[string]any {
		return map[string]any{"messages": userMsg("Why do long prompts hurt short requests under load?")}
	}
	ra, err := a.streamChat(ctx, body())
	if err != nil {
		t.Fatal(err)
	}
	ra2, err := a.chat(ctx, body())
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.streamChat(ctx, body())
	if err != nil {
		t.Fatal(err)
	}
	if ra.Text != rb.Text || ra.Text != ra2.Text {
		t.Errorf("same seed and prompt gave different answers:\n%q\n%q\n%q", ra.Text, ra2.Text, rb.Text)
	}
	ro, err := other.streamChat(ctx, body())
	if err != nil {
		t.Fatal(err)
	}
	if ro.Text == ra.Text {
		t.Errorf("different seeds gave the same answer %q", ro.Text)
	}
	// Answers echo the question so they read as related to it.
	if !strings.Contains(strings.ToLower(ra.Text), "prompts") && !strings.Contains(strings.ToLower(ra.Text), "load") &&
		!strings.Contains(strings.ToLower(ra.Text), "requests") && !strings.Contains(strings.ToLower(ra.Text), "short") {
		t.Errorf("answer %q echoes no word of the question", ra.Text)
	}
}

func TestModelsAndHealth(t *testing.T) {
	sim := start(t, testConfig())
	resp, err := sim.client.Get(sim.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "sluice-sim" || list.Data[0].Object != "model" {
		t.Errorf("models = %+v", list)
	}
	h, err := sim.client.Get(sim.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, h.Body)
	h.Body.Close()
	if h.StatusCode != http.StatusOK {
		t.Errorf("health status %d", h.StatusCode)
	}
}

func TestConfigValidateNamesFields(t *testing.T) {
	if err := llmsim.DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config invalid: %v", err)
	}
	cases := []struct {
		field string
		edit  func(*llmsim.Config)
	}{
		{"Model", func(c *llmsim.Config) { c.Model = "" }},
		{"Encoding", func(c *llmsim.Config) { c.Encoding = "gpt2" }},
		{"Replicas", func(c *llmsim.Config) { c.Replicas = 0 }},
		{"MaxNumSeqs", func(c *llmsim.Config) { c.MaxNumSeqs = 0 }},
		{"KVCacheBlocks", func(c *llmsim.Config) { c.KVCacheBlocks = -1 }},
		{"BlockSize", func(c *llmsim.Config) { c.BlockSize = 0 }},
		{"PrefillPerToken", func(c *llmsim.Config) { c.PrefillPerToken = -1 }},
		{"DecodeBase", func(c *llmsim.Config) { c.DecodeBase = 0 }},
		{"DecodePerSeq", func(c *llmsim.Config) { c.DecodePerSeq = -1 }},
		{"TimeScale", func(c *llmsim.Config) { c.TimeScale = 0 }},
		{"Mode", func(c *llmsim.Config) { c.Mode = "dynamic" }},
		{"DefaultMaxTokens", func(c *llmsim.Config) { c.DefaultMaxTokens = 0 }},
		{"AnswerMinTokens", func(c *llmsim.Config) { c.AnswerMinTokens = 0 }},
		{"AnswerMaxTokens", func(c *llmsim.Config) { c.AnswerMaxTokens = 10 }},
	}
	for _, tc := range cases {
		cfg := llmsim.DefaultConfig()
		tc.edit(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field+" ") {
			t.Errorf("bad %s: error %v does not name the field", tc.field, err)
		}
		if _, err := llmsim.New(cfg, nil); err == nil {
			t.Errorf("New accepted bad %s", tc.field)
		}
	}
}
