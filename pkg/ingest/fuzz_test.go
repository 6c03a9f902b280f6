package ingest_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/sluice-dev/sluice/pkg/ingest"
)

// FuzzValidate checks that a document Validate accepts is what its
// limits say (seeds: testdata/fuzz), and that it travels through JSON, as
// it does in the API and the store, unchanged.
func FuzzValidate(f *testing.F) {
	f.Fuzz(func(t *testing.T, id, title, text string) {
		d := ingest.Document{ID: id, Title: title, Text: text}
		if err := (&ingest.Ingester{}).Validate(d); err != nil {
			if !strings.HasPrefix(err.Error(), ingest.ErrInvalid.Error()+": ") {
				t.Fatalf("%+v: refused with %q, not an ErrInvalid", d, err)
			}
			return
		}
		switch {
		case id == "" || len(id) > ingest.MaxIDBytes || !utf8.ValidString(id) || strings.ContainsAny(id, "#@") || strings.ContainsFunc(id, unicode.IsControl):
			t.Fatalf("accepted id %q", id)
		case len(title) > ingest.MaxTitleBytes || !utf8.ValidString(title):
			t.Fatalf("accepted title %q", title)
		case strings.TrimSpace(text) == "" || len(text) > ingest.MaxTextBytes || !utf8.ValidString(text):
			t.Fatalf("accepted text %q", text)
		}
		raw, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		var back ingest.Document
		if err := json.Unmarshal(raw, &back); err != nil || back.ID != id || back.Title != title || back.Text != text {
			t.Fatalf("%+v comes back from JSON as %+v, %v", d, back, err)
		}
	})
}
