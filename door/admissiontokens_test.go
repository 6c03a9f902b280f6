package door

import (
	"testing"

	"github.com/sluice-dev/sluice/pkg/config"
)

// A request takes its place in the fair queue at its prompt's bound
// alone, whatever its max_tokens and the output weight (its output is
// charged as it streams); the rate limits' charge is its whole bound.
func TestAdmissionTokensArePromptOnly(t *testing.T) {
	for _, maxTokens := range []int{16, 256, 4096} {
		req := &Request{Gateway: true, promptTokens: 100, MaxTokens: &maxTokens, Choices: 2}
		for _, weight := range []float64{1, 2, 0.5} {
			cfg := config.Default()
			cfg.Admission.OutputTokenWeight = weight
			d := &Door{cfg: cfg}
			if got := d.admissionTokens(req); got != 100 {
				t.Errorf("max_tokens %d, weight %v: admission tokens %d, want the prompt's 100", maxTokens, weight, got)
			}
			if got := d.tokenBound(req); got != 100+2*maxTokens {
				t.Errorf("max_tokens %d, weight %v: token bound %d, want %d", maxTokens, weight, got, 100+2*maxTokens)
			}
		}
	}
}
