// Command llmsim serves the Sluice LLM simulator (cmd/internal/llmsimcli),
// the same as `sluice llmsim`.
package main

import (
	"os"

	"github.com/sluice-dev/sluice/cmd/internal/llmsimcli"
)

func main() { os.Exit(llmsimcli.Main(os.Args[1:])) }
