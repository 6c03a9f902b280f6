// Command sluice is Sluice's one command: `sluice serve api|worker|all`
// runs its processes, `sluice keys` manages API keys and bans, `sluice
// usage` reads the usage ledger, `sluice kb ingest` ingests files into a
// kb, `sluice config check FILE` checks a config file, `sluice
// healthcheck` probes a process for a container, `sluice version` prints
// the version, `sluice llmsim` runs the LLM simulator.
// `sluice -h` lists them; each answers -h. See cmd/internal/cli.
package main

import (
	"context"
	"os"
	"path/filepath"

	"github.com/sluice-dev/sluice/cmd/internal/cli"
)

// Run under another name (a link called sluice-api, sluice-worker,
// sluice-keys, sluice-usage or llmsim), it is that command.
func main() {
	os.Exit(cli.MainAs(context.Background(), filepath.Base(os.Args[0]), os.Args[1:], cli.OS()))
}
