package httpio

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/sluice-dev/sluice/pkg/refusal"
)

func postBody(body []byte) echo.Context {
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	req.Header.Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	return echo.New().NewContext(req, httptest.NewRecorder())
}

// Nesting up to MaxJSONDepth passes; one level more is refused, however
// the levels are spelled; brackets inside strings are text.
func TestDepthIsBounded(t *testing.T) {
	deep := func(n int) []byte {
		return []byte(strings.Repeat(`{"a":[`, n/2) + "1" + strings.Repeat(`]}`, n/2))
	}
	if err := checkDepth(deep(MaxJSONDepth)); err != nil {
		t.Fatalf("depth %d refused: %v", MaxJSONDepth, err)
	}
	if err := checkDepth(deep(MaxJSONDepth + 2)); err == nil {
		t.Fatalf("depth %d accepted", MaxJSONDepth+2)
	}
	text := []byte(`{"q":"` + strings.Repeat(`[{\"`, 1000) + `"}`)
	if err := checkDepth(text); err != nil {
		t.Fatalf("brackets inside a string counted: %v", err)
	}
}

// The worst body the largest limit (ingestion's 16 MiB) lets in — all
// brackets, then a byte that is not UTF-8 — is refused with a short
// message, at a memory cost bounded by the body's own size (reading it),
// not by its depth: a walk of its structure used to cost gigabytes.
func TestWorstBodyCostsItsSize(t *testing.T) {
	const limit = 16 << 20
	for name, body := range map[string][]byte{
		"brackets then invalid UTF-8":   append(bytes.Repeat([]byte("["), limit-1), 0xff),
		"a long key with invalid UTF-8": []byte(`{"` + strings.Repeat("k", limit-16) + "\xff" + `":1}`),
		"deep objects":                  []byte(strings.Repeat(`{"a":`, limit/5)),
	} {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err := ReadJSONBody(postBody(body), limit)
			runtime.ReadMemStats(&after)
			var ae *refusal.Error
			if !errors.As(err, &ae) || ae.Class != refusal.Invalid {
				t.Fatalf("refused with %v, want a 400", err)
			}
			if len(ae.Message) > 300 || len(ae.Param) > 300 {
				t.Fatalf("message of %d bytes, param of %d: %.80s…", len(ae.Message), len(ae.Param), ae.Message)
			}
			// Reading the body takes one buffer of its declared size; the
			// rest is small (the race detector's own bookkeeping included).
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 2*uint64(len(body)) {
				t.Fatalf("refusing a %d-byte body allocated %d bytes", len(body), alloc)
			}
		})
	}
}

// Bad text is refused naming the byte it starts at, an escaped lone
// surrogate as well as a byte that is not UTF-8.
func TestBadTextNamesItsByte(t *testing.T) {
	for body, at := range map[string]int{
		"{\"a\":\"ok\",\"b\":\"\xff\"}": 15,
		`{"a":"\ud800","b":1}`:          6,
		`{"a":"\\ud800","b":"\udc00x"}`: 20,
		`{"a":"fine"}`:                  -1,
	} {
		if got := badTextAt([]byte(body)); got != at {
			t.Errorf("badTextAt(%q) = %d, want %d", body, got, at)
		}
	}
	e := invalidUTF8([]byte("{\"query\":\"\xff\"}"))
	if !strings.Contains(e.Message, "query is not valid UTF-8 text (byte 10)") {
		t.Fatalf("message %q", e.Message)
	}
}
