package llmsim_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"

	"github.com/sluice-dev/sluice/pkg/llmsim"
)

func Example() {
	cfg := llmsim.DefaultConfig()
	cfg.TimeScale = 0.01 // a hundred times faster than real time
	sim, err := llmsim.New(cfg, nil)
	if err != nil {
		panic(err)
	}
	defer sim.Close()
	srv := httptest.NewServer(sim.Handler())
	defer srv.Close()

	body := `{"model":"sluice-sim","max_tokens":8,"messages":[{"role":"user","content":"What limits LLM throughput?"}]}`
	resp, err := srv.Client().Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			Message      struct{ Content string } `json:"message"`
			FinishReason string                   `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		panic(err)
	}
	fmt.Println(out.Choices[0].Message.Content)
	fmt.Println(out.Choices[0].FinishReason, out.Usage.PromptTokens, out.Usage.CompletionTokens)
	// Output:
	// Often every throughput this llm throughput model system
	// length 13 8
}
