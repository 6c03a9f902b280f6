// Command sluice is Sluice's one command: `sluice serve api|worker|all`
// runs its processes, `sluice keys` manages API keys and bans, `sluice
// usage` reads the usage ledger, `sluice kb ingest` ingests files into a
// kb, `sluice config check FILE` checks a config file, `sluice
// healthcheck` probes a process for a container, `sluice version` prints
// the version.
// `sluice -h` lists them; each answers -h. See cmd/internal/cli.
package main

import (
	"context"
	"os"

	"github.com/sluice-dev/sluice/cmd/internal/cli"
)

func main() { os.Exit(cli.Main(context.Background(), os.Args[1:], cli.OS())) }
