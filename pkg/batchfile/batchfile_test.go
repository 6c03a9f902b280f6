package batchfile

import (
	"fmt"
	"strings"
	"testing"
)

// bodies accepts any body but one whose model is "nope", as an endpoint
// refuses a model it does not serve.
func bodies(url string, body []byte) error {
	if strings.Contains(string(body), `"nope"`) {
		return &CheckError{Code: "model_not_found", Param: "model", Message: `no model "nope"`}
	}
	return nil
}

func line(id, url, body string) string {
	return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":%q,"body":%s}`+"\n", id, url, body)
}

func check(lines ...string) Report {
	c := NewChecker(bodies, 200)
	for _, l := range lines {
		c.Line([]byte(l))
	}
	return c.Report()
}

// Each way a line can be bad is reported with its line number, code and
// field; good lines around it are not.
func TestEachBadLineIsNamed(t *testing.T) {
	good := line("a", ChatCompletions, `{"model":"m"}`)
	cases := []struct {
		name, line, code, param string
	}{
		{"not JSON", "{oops\n", "invalid_json", ""},
		{"two values", `{"custom_id":"x","method":"POST","url":"/v1/embeddings","body":{}} {}` + "\n", "invalid_json", ""},
		{"unknown field", `{"custom_id":"x","method":"POST","url":"/v1/embeddings","body":{},"extra":1}` + "\n", "invalid_json", ""},
		{"blank", "   \n", "empty_line", ""},
		{"no custom_id", line("", ChatCompletions, `{}`), "missing_required_parameter", "custom_id"},
		{"GET", strings.Replace(line("x", ChatCompletions, `{}`), "POST", "GET", 1), "invalid_value", "method"},
		{"unknown url", line("x", "/v1/completions", `{}`), "invalid_value", "url"},
		{"body not an object", line("x", ChatCompletions, `[1]`), "invalid_value", "body"},
		{"body too large", line("x", ChatCompletions, `{"model":"`+strings.Repeat("m", 300)+`"}`), "body_too_large", "body"},
		{"the same custom_id", line("a", ChatCompletions, `{}`), "duplicate_custom_id", "custom_id"},
		{"another url", line("x", Embeddings, `{}`), "mismatched_url", "url"},
		{"a model not served", line("x", ChatCompletions, `{"model":"nope"}`), "model_not_found", "body.model"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := check(good, c.line, line("z", ChatCompletions, `{}`))
			if rep.Lines != 3 || rep.Bad != 1 || len(rep.Errors) != 1 {
				t.Fatalf("report %+v, want line 2 alone bad", rep)
			}
			e := rep.Errors[0]
			param := ""
			if e.Param != nil {
				param = *e.Param
			}
			if e.Line != 2 || e.Code != c.code || param != c.param || e.Message == "" {
				t.Fatalf("error %+v (param %q), want line 2 %s %q", e, param, c.code, c.param)
			}
			if rep.URL != ChatCompletions {
				t.Fatalf("url %q", rep.URL)
			}
		})
	}
}

// A file with 150 bad lines reports the first 100 of them, in order, and
// counts all 150; a good file reports none.
func TestTheFirstHundredBadLinesAreReported(t *testing.T) {
	c := NewChecker(bodies, 200)
	for i := range 300 {
		if i%2 == 0 {
			c.Line([]byte(line(fmt.Sprint(i), Embeddings, `{}`)))
		} else {
			c.Line([]byte("not json\n"))
		}
	}
	rep := c.Report()
	if rep.Lines != 300 || rep.Bad != 150 || len(rep.Errors) != MaxErrors {
		t.Fatalf("%d lines, %d bad, %d reported", rep.Lines, rep.Bad, len(rep.Errors))
	}
	for i, e := range rep.Errors {
		if e.Line != 2*i+2 {
			t.Fatalf("error %d on line %d, want %d", i, e.Line, 2*i+2)
		}
	}
	c.TooLong(10)
	if rep := c.Report(); rep.Bad != 151 || rep.Lines != 301 || len(rep.Errors) != MaxErrors {
		t.Fatalf("after a long line: %+v", rep)
	}
	if rep := check(line("a", Responses, `{}`), line("b", Responses, `{}`)); rep.Bad != 0 || rep.Lines != 2 || rep.URL != Responses {
		t.Fatalf("a good file: %+v", rep)
	}
}
