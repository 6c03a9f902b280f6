package tokens

import (
	"encoding/base64"
	"testing"

	"github.com/sluice-dev/sluice/tests/testenv"
)

// OpenAI's own examples, and the edges of the scaling.
func TestImageSizedCountsTilesAsOpenAIDoes(t *testing.T) {
	for _, tc := range []struct {
		w, h   int
		detail string
		want   int
	}{
		{1024, 1024, "high", 765},  // scaled to 768 × 768: 4 tiles
		{2048, 4096, "high", 1105}, // 1024 × 2048, then 768 × 1536: 6 tiles
		{4096, 8192, "low", 85},
		{512, 512, "auto", 255}, // one tile; never scaled up
		{100, 100, "", 255},
		{3000, 1100, "high", ImageMax}, // 2048 × 751: 8 tiles, the most
		{8000, 100, "high", 85 + 4*170},
	} {
		if got := ImageSized(tc.w, tc.h, tc.detail); got != tc.want {
			t.Errorf("%d × %d at %q: %d tokens, want %d", tc.w, tc.h, tc.detail, got, tc.want)
		}
	}
}

// A data: URL is counted by the size in its header; a remote image, or
// one whose header does not parse, by the most an image can cost.
func TestImageReadsADataURLsSize(t *testing.T) {
	for name, tc := range map[string]struct {
		url, detail string
		want        int
	}{
		"large png":    {testenv.PNGDataURL(t, 3000, 1100), "high", ImageMax},
		"square png":   {testenv.PNGDataURL(t, 1024, 1024), "auto", 765},
		"small png":    {testenv.PNGDataURL(t, 200, 150), "", 255},
		"low detail":   {"https://example.com/cat.png", "low", ImageLowDetail},
		"remote":       {"https://example.com/cat.png", "high", ImageMax},
		"not base64":   {"data:image/png,abc", "", ImageMax},
		"not an image": {"data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte("hello")), "", ImageMax},
	} {
		if got := Image(tc.url, tc.detail); got != tc.want {
			t.Errorf("%s: %d tokens, want %d", name, got, tc.want)
		}
	}
}
