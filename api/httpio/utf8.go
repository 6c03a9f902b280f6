package httpio

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/sluice-dev/sluice/pkg/refusal"
)

// textIntact reports whether a JSON body's text decodes as sent: its
// bytes are valid UTF-8 and no escape names half a surrogate pair
// ("\ud800" alone). encoding/json replaces either with U+FFFD without a
// word, so the decoded request would carry text the client never sent;
// it must be checked on the raw bytes.
func textIntact(b []byte) bool { return utf8.Valid(b) && !hasLoneSurrogate(b) }

// hasLoneSurrogate scans JSON text for a \u escape of a surrogate that is
// not a high one followed by a low one.
func hasLoneSurrogate(b []byte) bool { return loneSurrogateAt(b) >= 0 }

// loneSurrogateAt is the offset of the first \u escape of a lone
// surrogate in JSON text, or -1.
func loneSurrogateAt(b []byte) int {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		at := i
		// Skip the escaped character, so that "\\" is no escape of what
		// follows.
		i++
		if i >= len(b) || b[i] != 'u' {
			continue
		}
		r, ok := hex4(b[i+1:])
		if !ok || !utf16.IsSurrogate(r) {
			continue
		}
		i += 4
		if r >= 0xdc00 {
			return at
		}
		if i+2 >= len(b) || b[i+1] != '\\' || b[i+2] != 'u' {
			return at
		}
		if low, ok := hex4(b[i+3:]); !ok || low < 0xdc00 || low > 0xdfff {
			return at
		}
		i += 6
	}
	return -1
}

// badTextAt is the offset of the first byte of b that is not intact
// text (invalid UTF-8, or a lone surrogate's escape), or -1.
func badTextAt(b []byte) int {
	first := -1
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size <= 1 {
			first = i
			break
		}
		i += size
	}
	if at := loneSurrogateAt(b); at >= 0 && (first < 0 || at < first) {
		first = at
	}
	return first
}

// hex4 reads the four hex digits of a \u escape.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[:4]), 16, 16)
	return rune(n), err == nil
}

// namingLimit bounds the bodies whose bad text is named by its field: the
// walk that names it decodes every token before it. A larger body is told
// the byte offset only, which costs one pass and no allocation.
const namingLimit = 1 << 20

// invalidUTF8 is the refusal of a body whose text is not intact, naming
// the byte at fault and, in a body of up to namingLimit, its field.
func invalidUTF8(body []byte) *refusal.Error {
	at := badTextAt(body)
	var field, param string
	if len(body) <= namingLimit {
		field, param = badUTF8Field(body)
		field, param = bounded(field), bounded(param)
	}
	e := &refusal.Error{Class: refusal.Invalid, Code: "bad_utf8", Param: param,
		Message: fmt.Sprintf("%s is not valid UTF-8 text (byte %d)", field, at)}
	if field == "" {
		e.Message = fmt.Sprintf("the request body is not valid UTF-8 text (byte %d)", at)
	}
	return e
}

// maxPathBytes bounds a field path quoted back to the client: a key may be
// as long as the body allows.
const maxPathBytes = 200

// bounded cuts a field path to maxPathBytes, on a rune boundary.
func bounded(path string) string {
	if len(path) <= maxPathBytes {
		return path
	}
	cut := maxPathBytes
	for cut > 0 && !utf8.RuneStart(path[cut]) {
		cut--
	}
	return path[:cut] + "…"
}

// jsonFrame is one open object or array on the way to a token.
type jsonFrame struct {
	array bool
	// index is the array element being read.
	index int
	// key is the object member being read; wantKey is set between
	// members, where the next string is a name, not a value.
	key     string
	wantKey bool
}

// badUTF8Field walks a JSON document in one pass and names the first
// string whose text is not intact: field is its path for a message
// (messages[2].content, or "a field name in documents[0]" for a bad
// name), param the path for OpenAI's error param. Both are empty when the
// document is malformed before such a string, which is then not JSON.
// Only strings can hold bytes above ASCII in valid JSON, so the first
// token whose bytes are invalid is the one.
func badUTF8Field(body []byte) (field, param string) {
	dec := json.NewDecoder(bytes.NewReader(body))
	var stack []jsonFrame
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return "", ""
		}
		valid := textIntact(body[start:dec.InputOffset()])
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			if !endValue(stack) {
				return "", ""
			}
			continue
		}
		if n := len(stack); n > 0 && stack[n-1].wantKey {
			// The frames outside point at the object that holds the name.
			path := jsonPath(stack[:n-1])
			if !valid {
				if path == "" {
					return "a field name", ""
				}
				return "a field name in " + path, path
			}
			stack[n-1].key, _ = tok.(string)
			stack[n-1].wantKey = false
			continue
		}
		if !valid {
			p := jsonPath(stack)
			return p, p
		}
		if d, ok := tok.(json.Delim); ok {
			stack = append(stack, jsonFrame{array: d == '[', wantKey: d == '{'})
			continue
		}
		if !endValue(stack) {
			return "", ""
		}
	}
}

// endValue moves the innermost frame past a finished value; it reports
// false when the document itself is finished.
func endValue(stack []jsonFrame) bool {
	if len(stack) == 0 {
		return false
	}
	top := &stack[len(stack)-1]
	if top.array {
		top.index++
	} else {
		top.wantKey = true
	}
	return true
}

// jsonPath spells the path of the value the frames point at, as
// messages[2].content.
func jsonPath(stack []jsonFrame) string {
	var b strings.Builder
	for _, f := range stack {
		if f.array {
			b.WriteString("[" + strconv.Itoa(f.index) + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(f.key)
	}
	return b.String()
}
