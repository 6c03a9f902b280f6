// Command sluice-worker runs a Temporal worker for Sluice's chat workflows
// and activities, and the admission janitor: `sluice serve worker` under
// its own name (cmd/internal/cli).
package main

import (
	"os"

	"github.com/sluice-dev/sluice/cmd/internal/cli"
)

func main() { os.Exit(cli.ServeWorker(os.Args[1:])) }
