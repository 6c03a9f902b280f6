// Package llmsimcli serves the Sluice LLM simulator: a simulated
// continuous-batching inference server with an OpenAI-compatible API and
// vLLM-style metrics. It is not a model; see pkg/llmsim. It is the llmsim
// binary and `sluice llmsim`, so that the image's one binary holds it.
package llmsimcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/pkg/version"
)

// Main runs the simulator with args (its flags) until SIGINT or SIGTERM
// and returns the exit code.
func Main(args []string) int {
	if err := run(args); err != nil {
		slog.Error("llmsim failed", "err", err)
		return 1
	}
	return 0
}

func run(args []string) error {
	if version.Asked(args) {
		fmt.Println(version.Line("llmsim"))
		return nil
	}
	cfg := llmsim.DefaultConfig()
	fs := flag.NewFlagSet("llmsim", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8090", "listen address")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	grace := fs.Duration("shutdown-grace", 10*time.Second, "how long in-flight requests may finish after SIGINT/SIGTERM before they are aborted")
	configFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}

	logger, err := newLogger(*logLevel, *logFormat)
	if err != nil {
		return err
	}
	sim, err := llmsim.New(cfg, logger)
	if err != nil {
		return err
	}
	defer sim.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *addr, err)
	}
	// No write timeout: a streamed completion lasts as long as it lasts.
	srv := &http.Server{Handler: sim.Handler(), ReadHeaderTimeout: 10 * time.Second}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	logger.Info("llm simulator listening", "addr", ln.Addr().String(), "model", cfg.Model,
		"mode", cfg.Mode, "replicas", cfg.Replicas, "max_num_seqs", cfg.MaxNumSeqs,
		"kv_cache_blocks", cfg.KVCacheBlocks, "time_scale", cfg.TimeScale, "refuse_params", cfg.RefuseParams)
	if cfg.Fault != (llmsim.Fault{}) {
		logger.Warn("llm simulator starts with a fault", "fault", cfg.Fault)
	}

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve http on %s: %w", *addr, err)
	case <-ctx.Done():
	}
	logger.Info("shutting down", "grace", *grace)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), *grace)
	defer cancel()
	shutdownErr := srv.Shutdown(shutdownCtx)
	// Requests that outlived the grace period are aborted, which makes
	// their handlers return.
	sim.Close()
	if errors.Is(shutdownErr, context.DeadlineExceeded) {
		_ = srv.Close()
		shutdownErr = nil
	}
	if shutdownErr != nil {
		return fmt.Errorf("shut down http server: %w", shutdownErr)
	}
	return nil
}

// configFlags registers a flag for every setting of the simulator, its
// default the value cfg holds.
func configFlags(fs *flag.FlagSet, cfg *llmsim.Config) {
	fs.StringVar(&cfg.Model, "model", cfg.Model, "model name served and used as the model_name metric label")
	fs.StringVar(&cfg.Encoding, "encoding", cfg.Encoding, "tiktoken encoding that counts prompt tokens (cl100k_base or o200k_base)")
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "simulated replicas behind the endpoint")
	fs.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", cfg.MaxNumSeqs, "running batch limit per replica")
	fs.IntVar(&cfg.KVCacheBlocks, "kv-cache-blocks", cfg.KVCacheBlocks, "KV cache blocks per replica")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per KV cache block")
	fs.DurationVar(&cfg.PrefillPerToken, "prefill-per-token", cfg.PrefillPerToken, "prefill time per prompt token")
	fs.DurationVar(&cfg.DecodeBase, "decode-base", cfg.DecodeBase, "fixed time of one decode step")
	fs.DurationVar(&cfg.DecodePerSeq, "decode-per-seq", cfg.DecodePerSeq, "extra decode step time per running sequence")
	fs.Float64Var(&cfg.TimeScale, "time-scale", cfg.TimeScale, "wall time per simulated time (0.1 runs 10x faster)")
	fs.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the generated answers")
	fs.StringVar(&cfg.Mode, "mode", cfg.Mode, "scheduling: continuous or static")
	fs.IntVar(&cfg.DefaultMaxTokens, "default-max-tokens", cfg.DefaultMaxTokens, "output budget of requests that set no max_tokens")
	fs.IntVar(&cfg.AnswerMinTokens, "answer-min-tokens", cfg.AnswerMinTokens, "shortest natural answer, in tokens")
	fs.IntVar(&cfg.AnswerMaxTokens, "answer-max-tokens", cfg.AnswerMaxTokens, "longest natural answer, in tokens")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", cfg.MaxModelLen, "model context in tokens; a longer prompt gets 400 context_length_exceeded (0: the KV cache)")
	fs.BoolVar(&cfg.Fault.StallFirstToken, "fault-stall-first-token", false, "fault: accept requests but never send a token")
	fs.IntVar(&cfg.Fault.StallAfterTokens, "fault-stall-after-tokens", 0, "fault: stop every answer after this many tokens (0: off)")
	fs.IntVar(&cfg.Fault.DieAfterTokens, "fault-die-after-tokens", 0, "fault: drop a stream's connection when its answer reaches this many tokens, a continued prefix counted (0: off)")
	fs.IntVar(&cfg.Fault.ErrorStatus, "fault-error-status", 0, "fault: refuse every request with this HTTP status, 500..599 (0: off)")
	fs.DurationVar(&cfg.Fault.TokenDelay, "fault-token-delay", 0, "fault: extra time of every decode step (a slow replica)")
	fs.Func("refuse-params", "comma-separated sampling parameters (or n) the backend does not support, e.g. logit_bias,seed; requests that set one get 400",
		func(v string) error {
			cfg.RefuseParams = nil
			for name := range strings.SplitSeq(v, ",") {
				if name = strings.TrimSpace(name); name != "" {
					cfg.RefuseParams = append(cfg.RefuseParams, name)
				}
			}
			return nil
		})
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("parse -log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	default:
		return nil, fmt.Errorf("parse -log-format: want text or json, got %q", format)
	}
}
