package cli

import (
	"fmt"

	"github.com/sluice-dev/sluice/pkg/config"
)

const configUsage = `usage: sluice config check FILE
Checks FILE as a process starting with -config FILE would, with this
environment's SLUICE_* variables on top: exit 0 and "FILE: ok", or exit 1
listing every problem, each naming its field.`

// configCommand is `sluice config check FILE`.
func configCommand(args []string, env Env) int {
	if len(args) == 0 || args[0] != "check" {
		return usageOf(args, configUsage, env)
	}
	rest := args[1:]
	if len(rest) != 1 || helpAsked(rest) {
		return usageOf(rest, configUsage, env)
	}
	file := rest[0]
	// config.Load is start-up's own path: parse (unknown fields refused),
	// the environment on top, then every section's validation at once.
	if _, err := config.Load(file, env.Environ()); err != nil {
		fmt.Fprintf(env.Stderr, "%s: %v\n", file, err)
		return exitFail
	}
	fmt.Fprintf(env.Stdout, "%s: ok\n", file)
	return exitOK
}
