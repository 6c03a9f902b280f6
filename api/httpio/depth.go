package httpio

import (
	"fmt"

	"github.com/sluice-dev/sluice/pkg/refusal"
)

// MaxJSONDepth bounds how deeply a request body's arrays and objects may
// nest. No Sluice or OpenAI request needs more than a handful of levels
// (a tool's JSON schema the most); without a bound, a body of nothing
// but "[" costs every pass over it (the decoder, the field naming of an
// error) memory in proportion to its depth.
const MaxJSONDepth = 64

// checkDepth refuses a body nested deeper than MaxJSONDepth, in one pass
// over its bytes that allocates nothing: it counts brackets and braces
// outside strings. A malformed body may pass; the decoder refuses it.
func checkDepth(body []byte) error {
	depth, inString, escaped := 0, false, false
	for i, c := range body {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			if depth++; depth > MaxJSONDepth {
				return &refusal.Error{Class: refusal.Invalid, Code: "too_deep",
					Message: fmt.Sprintf("the JSON body nests deeper than %d levels (at byte %d)", MaxJSONDepth, i)}
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return nil
}
