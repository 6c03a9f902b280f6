package app

import (
	"log/slog"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/pkg/config"
)

func TestNewScalerFromConfig(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	if sc, err := newScaler("short", config.Scaler{Kind: config.ScalerNone}, logger); sc != nil || err != nil {
		t.Fatalf("none: %v %v", sc, err)
	}
	if sc, err := newScaler("short", config.Scaler{Kind: config.ScalerWebhook, URL: "http://hook:1/scale", Timeout: time.Second}, logger); sc == nil || err != nil {
		t.Fatalf("webhook: %v %v", sc, err)
	}
	if _, err := newScaler("short", config.Scaler{Kind: config.ScalerSimulator, URL: "::"}, logger); err == nil {
		t.Fatal("bad simulator URL accepted")
	}
}
