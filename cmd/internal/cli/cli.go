// Package cli is the sluice command: the processes (serve), API keys and
// bans (keys), the usage ledger (usage), kb ingestion (kb), a config
// check, a health probe for containers and the version, each a
// subcommand that answers -h. The single-purpose binaries
// are aliases of its subcommands: sluice-api is `sluice serve api`,
// sluice-worker `sluice serve worker`, sluice-keys `sluice keys`,
// sluice-usage `sluice usage`.
package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/sluice-dev/sluice/cmd/internal/kbcli"
	"github.com/sluice-dev/sluice/cmd/internal/keyscli"
	"github.com/sluice-dev/sluice/cmd/internal/llmsimcli"
	"github.com/sluice-dev/sluice/cmd/internal/usagecli"
	"github.com/sluice-dev/sluice/pkg/version"
)

// Exit codes of every subcommand.
const (
	exitOK    = 0 // done, or help asked
	exitFail  = 1 // the work failed: a bad config, an unhealthy process
	exitUsage = 2 // the command line is wrong
)

// Env is what a command reads and writes besides its arguments, so that
// tests can give their own.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	Environ        func() []string
}

// OS is the process's own environment and standard streams.
func OS() Env {
	return Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv, Environ: os.Environ}
}

const usage = `usage: sluice <command> [arguments]

commands:
  serve api|worker|all [-config FILE]
        run the API (with the worker api.embedded_worker embeds), a worker,
        or the API with its worker in one process, until SIGINT or SIGTERM
  keys [-url URL] create|list|revoke|bans|unban ...
        manage API keys and abuse bans through the admin API
        (the admin key comes from $SLUICE_ADMIN_KEY)
  usage [-url URL] [-from DAY] [-to DAY] [-group-by G] [-tenant T] [-csv]
        read the usage ledger: every tenant's with $SLUICE_ADMIN_KEY, the
        key's own tenant's with $SLUICE_KEY
  kb ingest [-url URL] -kb NAME [-batch N] [-state FILE] DIR|FILE...
        ingest markdown and text files as a kb's documents, in batches; a
        re-run sends only what changed (the key comes from $SLUICE_KEY)
  config check FILE
        check a config file as start-up does; exit 1 listing every problem
  healthcheck [-url URL] [-timeout D]
        GET a health endpoint (default http://127.0.0.1:8080/healthz) for
        container probes; exit 0 if it answers 2xx, else 1
  llmsim [flags]
        the LLM simulator (pkg/llmsim), as the llmsim binary
  version
        print the version, commit and Go version

"sluice <command> -h" tells a command's arguments and flags.`

// Main runs the sluice command with args (the command line after the
// program's name) and returns its exit code: 0 done or help asked, 1
// failed, 2 misused.
func Main(ctx context.Context, args []string, env Env) int {
	if len(args) == 0 {
		fmt.Fprintln(env.Stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch {
	case helpAsked(args):
		fmt.Fprintln(env.Stdout, usage)
		return exitOK
	case version.Asked(args):
		fmt.Fprintln(env.Stdout, version.Line("sluice"))
		return exitOK
	}
	switch cmd {
	case "serve":
		return serve(rest, env)
	case "keys":
		return keyscli.Main(ctx, "sluice keys", rest, env.Getenv, env.Stdout, env.Stderr)
	case "usage":
		return usagecli.Main(ctx, "sluice usage", rest, env.Getenv, env.Stdout, env.Stderr)
	case "kb":
		return kbCommand(ctx, rest, env)
	case "config":
		return configCommand(rest, env)
	case "healthcheck":
		return healthcheck(ctx, rest, env)
	case "llmsim":
		return llmsimcli.Main(rest)
	}
	fmt.Fprintf(env.Stderr, "sluice: unknown command %q\n\n%s\n", cmd, usage)
	return exitUsage
}

// Aliases are the names under which the sluice binary runs one of its
// commands directly, as the single-purpose binaries of those names do: the
// image holds sluice alone, and links of these names to it.
var Aliases = map[string][]string{
	"sluice-api": {"serve", "api"}, "sluice-worker": {"serve", "worker"},
	"sluice-keys": {"keys"}, "sluice-usage": {"usage"}, "llmsim": {"llmsim"},
}

// MainAs is Main for the binary run under name (its argv[0]'s base): an
// alias runs its command with args.
func MainAs(ctx context.Context, name string, args []string, env Env) int {
	if words, ok := Aliases[name]; ok {
		return Main(ctx, append(slices.Clone(words), args...), env)
	}
	return Main(ctx, args, env)
}

// helpAsked reports whether a command line asks for help: its first
// argument is -h, -help, --help or help.
func helpAsked(args []string) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		return true
	}
	return false
}

// usageOf answers a command line that is wrong, or asks for help, with a
// command's usage: on stdout with 0 when help was asked, else on stderr
// with 2.
func usageOf(args []string, text string, env Env) int {
	if helpAsked(args) {
		fmt.Fprintln(env.Stdout, text)
		return exitOK
	}
	fmt.Fprintln(env.Stderr, text)
	return exitUsage
}

// kbCommand is `sluice kb`. The first SIGINT or SIGTERM stops it between
// batches, with what was sent recorded so that a re-run resumes; a second
// one ends the process.
func kbCommand(ctx context.Context, args []string, env Env) int {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	defer stop()
	return kbcli.Main(ctx, "sluice kb", args, kbcli.Env{Stdout: env.Stdout, Stderr: env.Stderr, Getenv: env.Getenv})
}
