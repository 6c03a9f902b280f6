// Command sluice-api serves Sluice's HTTP API, with an embedded Temporal
// worker unless api.embedded_worker is false: `sluice serve api` under
// its own name (cmd/internal/cli).
package main

import (
	"os"

	"github.com/sluice-dev/sluice/cmd/internal/cli"
)

func main() { os.Exit(cli.ServeAPI(os.Args[1:])) }
