package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The image holds the binary, a link to it per alias, the CA bundle and
// passwd, runs as 10001 with the Dockerfile's command, and survives a
// round trip through its tarball; its sizes are its layer's.
func TestImageLayout(t *testing.T) {
	dir := t.TempDir()
	bin, ca := filepath.Join(dir, "sluice"), filepath.Join(dir, "ca.crt")
	binData := bytes.Repeat([]byte("sluice binary "), 10000)
	if err := os.WriteFile(bin, binData, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := Build(bin, ca)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "image.tar")
	ref, _ := name.NewTag("sluice:test")
	if err := tarball.WriteToFile(out, ref, img); err != nil {
		t.Fatal(err)
	}
	loaded, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loaded.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != "10001:10001" || !slices.Equal(cfg.Config.Cmd, []string{"sluice-api"}) {
		t.Errorf("config: user %q cmd %v", cfg.Config.User, cfg.Config.Cmd)
	}
	layers, err := loaded.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = h
		if h.Name == binDir+"sluice" {
			data, _ := io.ReadAll(tr)
			if !bytes.Equal(data, binData) || h.Mode != 0o755 {
				t.Errorf("the binary: %d bytes mode %o", len(data), h.Mode)
			}
		}
	}
	for _, want := range []string{"etc/passwd", "etc/ssl/certs/ca-certificates.crt", binDir + "sluice", "tmp/"} {
		if got[want] == nil {
			t.Errorf("no %s in the layer", want)
		}
	}
	for _, alias := range Aliases {
		if h := got[binDir+alias]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "sluice" {
			t.Errorf("%s: %+v, want a link to sluice", alias, h)
		}
	}
	if !strings.Contains(passwd, ":10001:10001:") {
		t.Error("passwd lacks the image's user")
	}
	s, err := Measure(img)
	if err != nil || s.Uncompressed <= int64(len(binData)) || s.Compressed <= 0 || s.Compressed >= s.Uncompressed {
		t.Errorf("sizes %+v (%v)", s, err)
	}
}

// The aliases are the Dockerfile's links.
func TestAliasesAreTheDockerfiles(t *testing.T) {
	raw, err := os.ReadFile("../docker/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), "for alias in "+strings.Join(Aliases, " ")+"; do ln -s sluice") {
		t.Errorf("deploy/docker/Dockerfile does not link %v", Aliases)
	}
}
