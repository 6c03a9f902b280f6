package testenv

import (
	"encoding/json"
	"strings"

	"github.com/sluice-dev/sluice/pkg/request"
)

// FinishedLines are the request.FinishedMessage lines of a JSON log
// (slog.NewJSONHandler), decoded; other lines are skipped.
func FinishedLines(log string) []map[string]any {
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		var m map[string]any
		if l == "" || json.Unmarshal([]byte(l), &m) != nil || m["msg"] != request.FinishedMessage {
			continue
		}
		out = append(out, m)
	}
	return out
}
