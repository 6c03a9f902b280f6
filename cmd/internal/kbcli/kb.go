// Package kbcli is `sluice kb`: knowledge-base work through the API. Its
// one command ingests a folder of markdown and text files:
//
//	sluice kb ingest -kb notes handbook/ faq.md
//
// Each file becomes one document whose id is its path relative to the
// folder given (or its name, for a file given alone) without the
// extension, sent in batches to POST /v1/kb/:kb/documents. A state file
// remembers what each document's content was and which revision the
// server made of it; a re-run sends only the files whose content changed
// or whose revision the kb no longer holds, so an interrupted run
// resumes where it stopped. The key ($SLUICE_KEY, with the ingest scope)
// comes from the environment, never from a flag; the server is -url,
// default $SLUICE_URL or http://127.0.0.1:8080.
package kbcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/cmd/internal/apiclient"
)

// Env is what the command reads and writes besides its arguments.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
	// Progress forces the progress display: "bar", "lines" or "none";
	// "" chooses a bar when Stderr is a terminal, else lines.
	Progress string
}

// Main runs `prog` (e.g. "sluice kb") with args and returns its exit code:
// 0 done or help asked, 1 failed (nothing sent, refused, interrupted, or
// files that could not be documents), 2 a wrong command line.
func Main(ctx context.Context, prog string, args []string, env Env) int {
	err := run(ctx, prog, args, env)
	var u usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &u):
		fmt.Fprintf(env.Stderr, "%s: %v\n\n%s\n", prog, err, usage(prog))
		return 2
	}
	fmt.Fprintf(env.Stderr, "%s: %v\n", prog, err)
	return 1
}

type usageError struct{ error }

func usage(prog string) string {
	return `usage: ` + prog + ` ingest -kb NAME [flags] DIR|FILE...
Ingests markdown and text files as documents of the kb NAME; a re-run sends
only what changed. The key comes from $SLUICE_KEY (the ingest scope).
"` + prog + ` ingest -h" lists the flags.`
}

func helpAsked(args []string) bool {
	return len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help")
}

func run(ctx context.Context, prog string, args []string, env Env) error {
	if len(args) == 0 {
		return usageError{errors.New("no command")}
	}
	if helpAsked(args) {
		fmt.Fprintln(env.Stdout, usage(prog))
		return flag.ErrHelp
	}
	if args[0] != "ingest" {
		return usageError{fmt.Errorf("unknown command %q", args[0])}
	}
	opts, err := parseIngest(prog+" ingest", args[1:], env)
	if err != nil {
		return err
	}
	return ingestFiles(ctx, opts, env)
}

// options is a parsed `kb ingest` command line.
type options struct {
	client     apiclient.Client
	kb         string
	paths      []string
	exts       []string
	batch      int
	batchBytes int
	state      string
	quiet      bool
}

// Defaults: a batch well inside the API's default ingest.max_documents
// (100) and ingest.max_body_bytes (16 MiB); a batch the server finds too
// large is split and sent again.
const (
	defaultBatch      = 50
	defaultBatchBytes = 4 << 20
	defaultState      = ".sluice-ingest.json"
	defaultExts       = ".md,.markdown,.txt"
)

// parseIngest reads `kb ingest`'s flags and paths; flags may come before,
// between or after the paths.
func parseIngest(name string, args []string, env Env) (options, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	base := apiclient.BaseURL(env.Getenv)
	fs.StringVar(&base, "url", base, "the API's base URL (env SLUICE_URL)")
	kb := fs.String("kb", "", "the kb to ingest into (required); made by its first write")
	exts := fs.String("ext", defaultExts, "the extensions of the files taken from a DIR (a FILE named is taken whatever its extension)")
	batch := fs.Int("batch", defaultBatch, "documents per request, at most the server's ingest.max_documents")
	batchBytes := fs.Int("batch-bytes", defaultBatchBytes, "bytes of documents per request, below the server's ingest.max_body_bytes")
	state := fs.String("state", defaultState, `the file that remembers what was ingested, so a re-run sends only what changed ("" for none)`)
	quiet := fs.Bool("quiet", false, "no progress, only the summary and errors")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: %s -kb NAME [flags] DIR|FILE...\n"+
			"Each file is a document whose id is its path relative to the DIR given (a FILE's name) without\n"+
			"the extension; markdown whose first line is \"# Title\" names itself. The key comes from $SLUICE_KEY.\n", name)
		fs.PrintDefaults()
	}
	if helpAsked(args) {
		fs.SetOutput(env.Stdout)
		fs.Usage()
		return options{}, flag.ErrHelp
	}
	var paths []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(env.Stdout)
				fs.Usage()
				return options{}, err
			}
			return options{}, usageError{err}
		}
		if fs.NArg() == 0 {
			break
		}
		paths, args = append(paths, fs.Arg(0)), fs.Args()[1:]
	}
	switch {
	case *kb == "":
		return options{}, usageError{errors.New("-kb is required: the kb to ingest into")}
	case len(paths) == 0:
		return options{}, usageError{errors.New("name at least one DIR or FILE")}
	case *batch < 1:
		return options{}, usageError{fmt.Errorf("-batch must be at least 1, got %d", *batch)}
	case *batchBytes < 1:
		return options{}, usageError{fmt.Errorf("-batch-bytes must be at least 1, got %d", *batchBytes)}
	}
	c := apiclient.New(base, env.Getenv("SLUICE_KEY"))
	// A batch of ingestion waits for a permit (ingest.max_wait) and is
	// chunked and embedded while the call waits.
	c.HTTP.Timeout = 5 * time.Minute
	return options{client: c, kb: *kb, paths: paths, exts: splitExts(*exts), batch: *batch,
		batchBytes: *batchBytes, state: *state, quiet: *quiet}, nil
}

// splitExts is -ext's list, each with its dot and in lower case.
func splitExts(s string) []string {
	var out []string
	for _, e := range strings.Split(s, ",") {
		e = strings.ToLower(strings.TrimSpace(e))
		if e == "" {
			continue
		}
		if !strings.HasPrefix(e, ".") {
			e = "." + e
		}
		out = append(out, e)
	}
	return out
}

// isTerminal reports whether w is a terminal, where a progress bar can
// redraw itself.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
