// Command sluice-api serves Sluice's HTTP API, with an embedded Temporal
// worker unless api.embedded_worker is false.
package main

import (
	"context"
	"log/slog"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/pkg/config"
)

func main() {
	app.Main("sluice-api", func(ctx context.Context, cfg config.Config, logger *slog.Logger) error {
		return app.RunAPI(ctx, cfg, logger, func(addr string) {
			logger.Info("api listening", "url", "http://"+addr)
		})
	})
}
