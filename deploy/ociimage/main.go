// Command ociimage builds, without a container engine, an image
// equivalent to deploy/docker/Dockerfile's: one layer holding the static
// sluice binary, the links that name its commands, the CA bundle and an
// /etc/passwd, on an empty base, run as uid 10001 with the same CMD. It
// writes it as a docker-loadable tarball and prints its sizes, which is
// how the image's size is measured where no docker runs (make image-oci).
// The Dockerfile's distroless base adds its own files (passwd, CA bundle,
// tzdata, a few licences) instead of the ones put here.
//
//	ociimage -bin dist/sluice -o sluice-image.tar [-tag sluice:dev]
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The image's layout, as the Dockerfile makes it.
const (
	binDir = "usr/local/bin/"
	uid    = 10001
	// passwd names the users a process may look up: root, and the uid the
	// image runs as.
	passwd = "root:x:0:0:root:/root:/sbin/nologin\nsluice:x:10001:10001:sluice:/nonexistent:/sbin/nologin\n"
)

// Aliases are the Dockerfile's links to sluice.
var Aliases = []string{"sluice-api", "sluice-worker", "sluice-keys", "sluice-usage", "llmsim"}

func main() {
	bin := flag.String("bin", "", "the static sluice binary (CGO_ENABLED=0)")
	ca := flag.String("ca", "/etc/ssl/certs/ca-certificates.crt", "the CA bundle to install")
	out := flag.String("o", "sluice-image.tar", "the tarball to write")
	tag := flag.String("tag", "sluice:dev", "the tag the tarball loads as")
	flag.Parse()
	if *bin == "" {
		fmt.Fprintln(os.Stderr, "usage: ociimage -bin PATH [-ca FILE] [-o FILE] [-tag NAME]")
		os.Exit(2)
	}
	if err := run(*bin, *ca, *out, *tag); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run(bin, ca, out, tag string) error {
	img, err := Build(bin, ca)
	if err != nil {
		return err
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("tag %s: %w", tag, err)
	}
	if err := tarball.WriteToFile(out, ref, img); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	s, err := Measure(img)
	if err != nil {
		return err
	}
	st, err := os.Stat(out)
	if err != nil {
		return err
	}
	fmt.Printf("%s (%s): layer %d bytes compressed (gzip), %d uncompressed; tarball %d bytes\n",
		out, tag, s.Compressed, s.Uncompressed, st.Size())
	return nil
}

// Build is the image: one layer on an empty base, and the config the
// Dockerfile sets (user, command, exposed ports).
func Build(bin, ca string) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		raw, err := layerTar(bin, ca)
		if err != nil {
			return nil, err
		}
		return io.NopCloser(bytes.NewReader(raw)), nil
	})
	if err != nil {
		return nil, fmt.Errorf("make the layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config.User = fmt.Sprintf("%d:%d", uid, uid)
	cfg.Config.Cmd = []string{"sluice-api"}
	cfg.Config.Env = []string{"PATH=/usr/local/bin"}
	cfg.Config.ExposedPorts = map[string]struct{}{"8080/tcp": {}, "8090/tcp": {}}
	return mutate.ConfigFile(img, cfg)
}

// layerTar is the layer's files: the folders, passwd, the CA bundle, the
// binary and its links.
func layerTar(bin, ca string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, dir := range []string{"etc/", "etc/ssl/", "etc/ssl/certs/", "tmp/", "usr/", "usr/local/", binDir} {
		mode := int64(0o755)
		if dir == "tmp/" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	files := []struct {
		name, src string
		data      []byte
		mode      int64
	}{
		{name: "etc/passwd", data: []byte(passwd), mode: 0o644},
		{name: "etc/ssl/certs/ca-certificates.crt", src: ca, mode: 0o644},
		{name: binDir + "sluice", src: bin, mode: 0o755},
	}
	for _, f := range files {
		data := f.data
		if f.src != "" {
			var err error
			if data, err = os.ReadFile(f.src); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	for _, alias := range Aliases {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: binDir + alias, Linkname: "sluice", Mode: 0o777, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Sizes is an image's layers' total size, as a registry stores them
// (gzip) and as they are unpacked.
type Sizes struct{ Compressed, Uncompressed int64 }

// Measure adds up img's layers.
func Measure(img v1.Image) (Sizes, error) {
	layers, err := img.Layers()
	if err != nil {
		return Sizes{}, err
	}
	var s Sizes
	for _, l := range layers {
		c, err := l.Size()
		if err != nil {
			return Sizes{}, err
		}
		rc, err := l.Uncompressed()
		if err != nil {
			return Sizes{}, err
		}
		u, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return Sizes{}, err
		}
		s.Compressed += c
		s.Uncompressed += u
	}
	return s, nil
}
