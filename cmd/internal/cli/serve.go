package cli

import (
	"context"
	"log/slog"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/pkg/config"
)

const serveUsage = `usage: sluice serve api|worker|all [-config FILE]
  api     the HTTP API, with a worker embedded when api.embedded_worker
          is true (the default)
  worker  a Temporal worker alone, with its metrics on metrics.worker_addr
  all     the API with its worker embedded whatever api.embedded_worker
          says: the whole of Sluice in one process
-config FILE names the config file (default $SLUICE_CONFIG; none: the
defaults); SLUICE_* variables override it. "version" or -version prints
the version.`

// serve runs one of Sluice's processes until SIGINT or SIGTERM.
func serve(args []string, env Env) int {
	if len(args) == 0 || helpAsked(args) {
		return usageOf(args, serveUsage, env)
	}
	switch args[0] {
	case "api":
		return ServeAPI(args[1:])
	case "worker":
		return ServeWorker(args[1:])
	case "all":
		return app.Run("sluice", args[1:], runAPI(true))
	}
	return usageOf(args, serveUsage, env)
}

// ServeAPI is `sluice serve api` and the sluice-api binary: args are the
// flags after it.
func ServeAPI(args []string) int { return app.Run("sluice-api", args, runAPI(false)) }

// ServeWorker is `sluice serve worker` and the sluice-worker binary.
func ServeWorker(args []string) int { return app.Run("sluice-worker", args, app.RunWorker) }

// runAPI runs the API process; withWorker embeds a worker whatever
// api.embedded_worker says.
func runAPI(withWorker bool) func(context.Context, config.Config, *slog.Logger) error {
	return func(ctx context.Context, cfg config.Config, logger *slog.Logger) error {
		if withWorker {
			cfg.API.EmbeddedWorker = true
		}
		return app.RunAPI(ctx, cfg, logger, func(addr string) {
			logger.Info("api listening", "url", "http://"+addr)
		})
	}
}
