package door

import (
	"testing"

	"github.com/sluice-dev/sluice/pkg/config"
)

// The fair queue's size of a request weights its output tokens by
// admission.output_token_weight; the rate limits' charge does not.
func TestAdmissionTokensWeightOutput(t *testing.T) {
	maxTokens := 256
	req := &Request{Gateway: true, promptTokens: 100, MaxTokens: &maxTokens, Choices: 2}
	for _, c := range []struct {
		weight float64
		want   int
	}{{1, 100 + 512}, {2, 100 + 1024}, {0.5, 100 + 256}, {0, 100 + 512}} {
		cfg := config.Default()
		cfg.Admission.OutputTokenWeight = c.weight
		d := &Door{cfg: cfg}
		if got := d.admissionTokens(req); got != c.want {
			t.Errorf("weight %v: admission tokens %d, want %d", c.weight, got, c.want)
		}
		if got := d.tokenBound(req); got != 612 {
			t.Errorf("weight %v: token bound %d, want 612 whatever the weight", c.weight, got)
		}
	}
}
