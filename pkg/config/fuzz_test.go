package config

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"go.yaml.in/yaml/v3"
)

// loadBytes is Load of a file holding raw.
func loadBytes(t *testing.T, raw []byte) (Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return Load(path, nil)
}

// FuzzLoad feeds Load arbitrary files (seeds: testdata/fuzz, the example
// file and every bad fixture among them): it must refuse or return a valid
// configuration that, written back out, loads to the same configuration.
func FuzzLoad(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		cfg, err := loadBytes(t, raw)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("%q: refused without a message", raw)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("%q: loaded an invalid config: %v", raw, err)
		}
		out, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatalf("%q: loaded config does not marshal: %v", raw, err)
		}
		again, err := loadBytes(t, out)
		if err != nil {
			t.Fatalf("%q: loaded config, written out, does not load: %v\n%s", raw, err, out)
		}
		out2, err := yaml.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, out2) {
			t.Fatalf("%q: config changes when written out and loaded:\n%s\n---\n%s", raw, out, out2)
		}
	})
}
