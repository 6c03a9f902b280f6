package testenv

import (
	"bytes"
	"encoding/base64"
	"image"
	"image/png"
	"testing"
)

// PNGDataURL is a data: URL of a blank PNG of width × height pixels, as
// a client sends an image it holds (tests of image token counts).
func PNGDataURL(t testing.TB, width, height int) string {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, width, height))); err != nil {
		t.Fatal(err)
	}
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(buf.Bytes())
}
