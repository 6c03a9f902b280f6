package fairness

import (
	"encoding/csv"
	"fmt"
	"os"
	"strconv"
)

// writeRequests writes every replayed request, one CSV row each, for a
// look beyond the paper's summaries: per client, when it asked and when
// it was served, in trace seconds.
func (s *fairnessScenario) writeRequests(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write([]string{"workload", "system", "client", "arrival_s", "prompt_tokens", "output_tokens",
		"first_token_s", "last_token_s", "served_prompt_tokens", "served_output_tokens", "outcome", "route"})
	ff := func(x float64) string { return strconv.FormatFloat(x, 'f', 3, 64) }
	for _, run := range s.runs {
		for _, fs := range run.Systems {
			for i, q := range fs.Reqs {
				o := fs.Outcomes[i]
				first, last := "", ""
				if q.Served {
					first, last = ff(q.First), ff(q.Last)
				}
				_ = w.Write([]string{run.Workload.Name, fs.Name, q.Client, ff(q.Arrival), strconv.Itoa(q.Prompt), strconv.Itoa(q.Output),
					first, last, strconv.Itoa(q.GotPrompt), strconv.Itoa(q.GotOutput), o.Kind, o.Route})
			}
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
