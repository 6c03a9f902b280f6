package retrieval

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseDocument(t *testing.T) {
	d := ParseDocument("guides/rate-limits", "\n# Rate limits\n\nBody text.\n")
	if d.Title != "Rate limits" || d.Text != "Body text." || d.ID != "guides/rate-limits" {
		t.Errorf("with heading: %+v", d)
	}
	d = ParseDocument("guides/rate_limits-faq", "Just text.\r\nMore.")
	if d.Title != "rate limits faq" || d.Text != "Just text.\nMore." {
		t.Errorf("without heading: %+v", d)
	}
}

func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("b.md", "# Bee\n\nBuzz.")
	write("a.txt", "Plain.")
	write("sub/c.md", "# Sea\n\nWaves.")
	write("ignored.json", `{"x":1}`)
	docs, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range docs {
		ids = append(ids, d.ID+"="+d.Title)
	}
	if got, want := strings.Join(ids, ","), "a=a,b=Bee,sub/c=Sea"; got != want {
		t.Errorf("loaded %s, want %s", got, want)
	}
	if _, err := LoadDir(t.TempDir()); err == nil {
		t.Error("LoadDir of an empty directory succeeded")
	}
	if _, err := LoadDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("LoadDir of a missing directory succeeded")
	}
}

func TestBuiltinCorpus(t *testing.T) {
	if got := BuiltinNames(); len(got) != 1 || got[0] != "sluice-docs" {
		t.Errorf("BuiltinNames() = %v", got)
	}
	docs, err := Builtin("sluice-docs")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) < 25 || len(docs) > 40 {
		t.Errorf("built-in corpus has %d documents, want 25-40", len(docs))
	}
	for _, d := range docs {
		if d.Title == "" || len(strings.Fields(d.Text)) < 60 {
			t.Errorf("document %s: title %q, %d words", d.ID, d.Title, len(strings.Fields(d.Text)))
		}
	}
	for _, bad := range []string{"", "nope", "../corpus", "sluice-docs/token-bucket.md"} {
		if _, err := Builtin(bad); err == nil {
			t.Errorf("Builtin(%q) succeeded", bad)
		}
	}
}
