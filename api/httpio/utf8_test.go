package httpio

import "testing"

func TestBadUTF8Field(t *testing.T) {
	for body, want := range map[string]string{
		"{\"a\":\"\xff\"}": "a",
		"{\"a\":[1,\"x\",{\"b\":null,\"c\":\"\xff\"}]}": "a[2].c",
		"[\"ok\",\"\xff\"]":                             "[1]",
		"{\"a\":{\"\xff\":1}}":                          "a field name in a",
		"{\"\xff\":1}":                                  "a field name",
		"{\"a\":{\"b\":[]},\"c\":{},\"d\":\"\xff\"}":    "d",
		"\"\xff\"":      "",
		"{\"a\":1}\xff": "",
		"{\"a\":\xff}":  "",
		"{\"a\":\"ok\"": "",
		`{"a":"\ud83d\ude00","b":"\\ud800","c":"\udc00"}`: "c",
		`{"a":"\uD83D"}`: "a",
	} {
		if field, _ := badUTF8Field([]byte(body)); field != want {
			t.Errorf("badUTF8Field(%q) = %q, want %q", body, field, want)
		}
	}
}

func TestHasLoneSurrogate(t *testing.T) {
	for raw, want := range map[string]bool{
		`"\ud83d\ude00"`: false, // a pair: one emoji
		`"\\ud800"`:      false, // an escaped backslash, then text
		`"\\\ud800"`:     true,
		`"\ud800"`:       true,
		`"\udfff x"`:     true,
		`"\ud800\u0041"`: true,
		`"\ud800\n"`:     true,
		`"\ud800\udc0"`:  true,
		`"\ud7ff\ue000"`: false,
		`"\u12"`:         false,
		`"\ud83d\ude00\`: false,
	} {
		if got := hasLoneSurrogate([]byte(raw)); got != want {
			t.Errorf("hasLoneSurrogate(%s) = %v, want %v", raw, got, want)
		}
	}
}
