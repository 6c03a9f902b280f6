// Command sluice-usage reads Sluice's usage ledger through the API:
// `sluice usage` under its own name (cmd/internal/usagecli).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/sluice-dev/sluice/cmd/internal/usagecli"
	"github.com/sluice-dev/sluice/pkg/version"
)

func main() {
	if version.Asked(os.Args[1:]) {
		fmt.Println(version.Line("sluice-usage"))
		return
	}
	os.Exit(usagecli.Main(context.Background(), "sluice-usage", os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}
