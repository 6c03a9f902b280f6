// Package figuretest reads and writes the fixtures of the figures' tests
// and checks the PNGs drawn from them.
package figuretest

import (
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

// Read reads a fixture.
func Read(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// WriteFixture writes content to name in a fresh directory.
func WriteFixture(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// DecodePNG reads a PNG the plot wrote.
func DecodePNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s is not a PNG: %v", path, err)
	}
	return img
}

// pixelsOf counts the pixels of exactly colour c: a series drawn in c
// leaves hundreds; an empty panel none.
func pixelsOf(img image.Image, c color.Color) int {
	r0, g0, b0, _ := c.RGBA()
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if r == r0 && g == g0 && bl == b0 {
				n++
			}
		}
	}
	return n
}

// CheckPNG checks the figure's size and that each of colours was drawn.
func CheckPNG(t *testing.T, path string, w, h int, colours map[string]color.Color) {
	t.Helper()
	img := DecodePNG(t, path)
	if got := img.Bounds().Size(); got.X != w || got.Y != h {
		t.Errorf("%s is %dx%d, want %dx%d", filepath.Base(path), got.X, got.Y, w, h)
	}
	for what, c := range colours {
		if n := pixelsOf(img, c); n < 200 {
			t.Errorf("%s: %d pixels of %s, want a drawn series (>= 200)", filepath.Base(path), n, what)
		}
	}
}
