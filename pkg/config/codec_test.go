package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Keys are read from a file or a variable, in base64; the variable may be
// a SLUICE_CODEC_KEY_* one, which is not taken for an unknown setting.
func TestCodecKeysFromFileAndEnv(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(path, []byte(`
codec:
  enabled: true
  active_key: "2025-02"
  keys:
    - {id: "2025-01", file: `+filepath.Join("testdata", "codec_test.key")+`}
    - {id: "2025-02", env: SLUICE_CODEC_KEY_2025_02}
  ui_origins: ["http://localhost:8233"]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path, []string{"SLUICE_CODEC_KEY_2025_02=" + strings.Repeat("QUJD", 10) + "QUI=", "SLUICE_CODEC_UI_ORIGINS=http://ui:8080"})
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Codec
	if !c.Enabled || c.ActiveKey != "2025-02" || len(c.Keys) != 2 || string(c.Keys[0].Secret) != "sluice-test-codec-key-NOT-SECRET" ||
		len(c.Keys[1].Secret) != 32 || strings.Join(c.UIOrigins, ",") != "http://ui:8080" {
		t.Fatalf("codec %+v", c)
	}
}

// A configuration built in code (a test's) may give the key itself.
func TestCodecKeyGivenInCode(t *testing.T) {
	cfg := Default()
	cfg.Codec = Codec{Enabled: true, ActiveKey: "t", Keys: []CodecKey{{ID: "t", Secret: []byte("sluice-test-codec-key-NOT-SECRET")}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.Codec.Keys[0].Secret = cfg.Codec.Keys[0].Secret[:31]
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "codec.keys[0]: must be 32 bytes") {
		t.Fatalf("short key: %v", err)
	}
}

// Off, the section is not checked: keys may be listed ahead of turning
// it on.
func TestCodecOffIsNotChecked(t *testing.T) {
	cfg := Default()
	cfg.Codec = Codec{Keys: []CodecKey{{ID: "x"}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}
