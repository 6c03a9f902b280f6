package llmsim_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// continueBody asks to continue prefix as the answer to question.
func continueBody(question, prefix string, maxTokens int) map[string]any {
	return map[string]any{
		"messages": []map[string]any{
			{"role": "user", "content": question},
			{"role": "assistant", "content": prefix},
		},
		"max_tokens": maxTokens, "continue_final_message": true, "add_generation_prompt": false,
	}
}

// TestContinuationIsTheUninterruptedRest cuts an answer at every kind of
// place — on a token boundary, inside a token, at the start, at its end —
// and checks that the continuation is exactly the rest of the uninterrupted
// answer, with the same finish and the max_tokens budget counted from where
// it resumes.
func TestContinuationIsTheUninterruptedRest(t *testing.T) {
	sim := start(t, testConfig())
	ctx := context.Background()
	const question = "How does a token bucket refill?"
	for _, maxTokens := range []int{200, 25} {
		whole, err := sim.streamChat(ctx, map[string]any{"messages": userMsg(question), "max_tokens": maxTokens})
		if err != nil {
			t.Fatal(err)
		}
		toks := splitTokens(whole.Text)
		if len(toks) != whole.Usage.CompletionTokens {
			t.Fatalf("split %d tokens, the answer used %d", len(toks), whole.Usage.CompletionTokens)
		}
		// Each cut, and the tokens the prefix holds whole: a token cut in
		// two is generated again, whole, in the budget.
		seven := len(strings.Join(toks[:7], ""))
		cuts := map[string][2]int{
			"boundary":  {seven, 7},
			"mid-token": {seven + 2, 7},
			"start":     {0, 0},
			"end":       {len(whole.Text), len(toks)},
		}
		for name, c := range cuts {
			if name == "end" && whole.Finish == "length" {
				// max_tokens 1 for the rest of an answer cut by its
				// budget rightly writes one token more.
				continue
			}
			prefix, used := whole.Text[:c[0]], c[1]
			rest, err := sim.streamChat(ctx, continueBody(question, prefix, max(1, maxTokens-used)))
			if err != nil {
				t.Fatalf("max_tokens %d, cut at %s: %v", maxTokens, name, err)
			}
			if prefix+rest.Text != whole.Text {
				t.Errorf("max_tokens %d, cut at %s: joined %q\nwant %q", maxTokens, name, prefix+rest.Text, whole.Text)
			}
			if name != "end" && rest.Finish != whole.Finish {
				t.Errorf("max_tokens %d, cut at %s: finish %q, the whole answer's %q", maxTokens, name, rest.Finish, whole.Finish)
			}
			if rest.Usage.PromptTokens <= whole.Usage.PromptTokens && c[0] > 0 {
				t.Errorf("cut at %s: prompt %d tokens, not more than the question's %d: the prefix is part of the prompt", name, rest.Usage.PromptTokens, whole.Usage.PromptTokens)
			}
		}
	}
}

// splitTokens cuts a prose answer into its tokens: one word each, every
// one but the first after a space.
func splitTokens(text string) []string {
	var out []string
	for i, w := range strings.Split(text, " ") {
		if i > 0 {
			w = " " + w
		}
		if w != "" {
			out = append(out, w)
		}
	}
	return out
}

func TestContinuationOfAnotherText(t *testing.T) {
	sim := start(t, testConfig())
	prefix := "Something this model would never say"
	rest, err := sim.streamChat(context.Background(), continueBody("How does a token bucket refill?", prefix, 5))
	if err != nil {
		t.Fatal(err)
	}
	if rest.Usage.CompletionTokens != 5 || !strings.HasPrefix(rest.Text, " ") {
		t.Fatalf("continuation %q with %d tokens; want 5 tokens, each after a space", rest.Text, rest.Usage.CompletionTokens)
	}
}

func TestContinuationRefusals(t *testing.T) {
	sim := start(t, testConfig())
	both := continueBody("q", "a", 5)
	delete(both, "add_generation_prompt") // vLLM defaults it to true
	notAssistant := continueBody("q", "a", 5)
	notAssistant["messages"] = userMsg("q")
	several := continueBody("q", "a", 5)
	several["n"] = 2
	for name, body := range map[string]map[string]any{"add_generation_prompt": both, "continue_final_message": notAssistant, "n": several} {
		resp, err := post(context.Background(), sim.client, sim.url+"/v1/chat/completions", body)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), `"param":"`+name+`"`) {
			t.Errorf("%s: %d %s; want 400 naming %s", name, resp.StatusCode, raw, name)
		}
	}
}

// TestFaultDieAfterTokens drops the connection when the answer reaches
// the fault's token, and not in a continuation that starts past it.
func TestFaultDieAfterTokens(t *testing.T) {
	sim := start(t, testConfig())
	ctx := context.Background()
	const question = "die mid-answer"
	whole, err := sim.streamChat(ctx, map[string]any{"messages": userMsg(question), "max_tokens": 30})
	if err != nil {
		t.Fatal(err)
	}
	if status, _, raw := sim.setConfig(t, `{"fault": {"die_after_tokens": 10}}`); status != http.StatusOK {
		t.Fatalf("set fault: %d %s", status, raw)
	}
	resp, err := post(ctx, sim.client, sim.url+"/v1/chat/completions", map[string]any{"messages": userMsg(question), "max_tokens": 30, "stream": true})
	if err != nil {
		t.Fatal(err)
	}
	payloads, err := readSSE(resp.Body)
	resp.Body.Close()
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("reading a stream that died: %v, want an unexpected EOF", err)
	}
	// The opening chunk (role and empty content), then ten tokens.
	if len(payloads) != 11 {
		t.Errorf("%d chunks before the connection dropped, want 11: %q", len(payloads), payloads)
	}
	toks := splitTokens(whole.Text)
	prefix := strings.Join(toks[:10], "")
	rest, err := sim.streamChat(ctx, continueBody(question, prefix, 20))
	if err != nil {
		t.Fatalf("a continuation past the fault's token: %v", err)
	}
	if prefix+rest.Text != whole.Text {
		t.Errorf("joined %q, want %q", prefix+rest.Text, whole.Text)
	}
	early := strings.Join(toks[:4], "")
	// A completion that is not streamed and dies sends no response.
	if _, err := sim.chat(ctx, continueBody(question, early, 26)); err == nil {
		t.Error("a continuation from token 4 was answered; its connection should drop at token 10")
	}
}
