package testenv

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// SSEEvent is one parsed Server-Sent Event.
type SSEEvent struct {
	ID    string
	Event string
	Data  string
}

// Decode unmarshals the event's data.
func (e SSEEvent) Decode(v any) error { return json.Unmarshal([]byte(e.Data), v) }

// SSEReader parses an event stream incrementally.
type SSEReader struct {
	sc *bufio.Scanner
}

// NewSSEReader reads events from r.
func NewSSEReader(r io.Reader) *SSEReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	return &SSEReader{sc: sc}
}

// Next returns the next event, skipping comments; io.EOF at the end.
func (r *SSEReader) Next() (SSEEvent, error) {
	var ev SSEEvent
	seen := false
	for r.sc.Scan() {
		line := r.sc.Text()
		switch {
		case line == "":
			if seen {
				return ev, nil
			}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id:"):
			ev.ID, seen = strings.TrimSpace(line[3:]), true
		case strings.HasPrefix(line, "event:"):
			ev.Event, seen = strings.TrimSpace(line[6:]), true
		case strings.HasPrefix(line, "data:"):
			if ev.Data != "" {
				ev.Data += "\n"
			}
			ev.Data, seen = ev.Data+strings.TrimPrefix(line[5:], " "), true
		default:
			return ev, fmt.Errorf("unexpected SSE line %q", line)
		}
	}
	if err := r.sc.Err(); err != nil {
		return ev, err
	}
	return ev, io.EOF
}
