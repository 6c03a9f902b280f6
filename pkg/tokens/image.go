package tokens

import (
	"encoding/base64"
	"image"
	// The formats OpenAI accepts, registered for image.DecodeConfig.
	_ "image/gif"
	_ "image/jpeg"
	_ "image/png"
	"math"
	"strings"

	_ "golang.org/x/image/webp"
)

// How OpenAI's tile-counting vision models (GPT-4o and its kin) count an
// image: a low-detail image is a fixed charge; a high-detail one is
// scaled down to fit a 2048-pixel square, then until its shortest side is
// at most 768 pixels, and costs a fixed charge plus a charge for each
// 512-pixel tile that covers it. "auto" may be either, so it is counted
// as high.
const (
	ImageLowDetail  = 85
	imageBase       = 85
	imageTile       = 170
	imageTileSide   = 512
	imageLongestMax = 2048
	imageShortMax   = 768
)

// ImageMax is the most a high-detail image can cost: 4 × 2 tiles (a
// 2048 × 768 image, or wider). It bounds an image whose size is unknown.
const ImageMax = imageBase + 8*imageTile

// ImageSized is what an image of width × height pixels costs at detail.
func ImageSized(width, height int, detail string) int {
	if detail == "low" {
		return ImageLowDetail
	}
	if width <= 0 || height <= 0 {
		return ImageMax
	}
	w, h := float64(width), float64(height)
	if long := max(w, h); long > imageLongestMax {
		w, h = w*imageLongestMax/long, h*imageLongestMax/long
	}
	if short := min(w, h); short > imageShortMax {
		w, h = w*imageShortMax/short, h*imageShortMax/short
	}
	tiles := math.Ceil(w/imageTileSide) * math.Ceil(h/imageTileSide)
	return imageBase + int(tiles)*imageTile
}

// Image is what an image part (its URL and detail) costs, as far as the
// door can tell without fetching anything: a data: URL's size is read
// from its header (PNG, JPEG, GIF or WebP; only the first bytes are
// decoded), and any other image, or one whose header does not parse, is
// bounded by ImageMax.
func Image(url, detail string) int {
	if detail == "low" {
		return ImageLowDetail
	}
	w, h, ok := dataURLSize(url)
	if !ok {
		return ImageMax
	}
	return ImageSized(w, h, detail)
}

// dataURLSize is the pixel size of a base64 data: URL's image.
func dataURLSize(url string) (width, height int, ok bool) {
	rest, isData := strings.CutPrefix(url, "data:")
	if !isData {
		return 0, 0, false
	}
	meta, payload, found := strings.Cut(rest, ",")
	if !found || !strings.HasSuffix(meta, ";base64") {
		return 0, 0, false
	}
	cfg, _, err := image.DecodeConfig(base64.NewDecoder(base64.StdEncoding, strings.NewReader(payload)))
	if err != nil {
		return 0, 0, false
	}
	return cfg.Width, cfg.Height, true
}
