package stack

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/sluice-dev/sluice/tests/testenv"
)

// Processes are a stack's API and worker when they run as OS processes
// of their own (Options.Processes), as make run starts them:
// sluice-api with its embedded worker, and a sluice-worker beside it, both
// built from this checkout. Each has its own memory, goroutines and
// workflow cache, which the soak scenario watches.
type Processes struct {
	dir         string
	API, Worker *testenv.Process
	// The URLs of their GET /metrics.
	APIMetrics, WorkerMetrics string
}

// startProcesses builds the binaries and starts the worker, then the API,
// on s.cfg with free ports of their own, and waits until the API is
// ready. Their configs and logs are in a directory of their own, named if
// they fail to start.
func (s *Stack) startProcesses(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "sluice-bench-procs-")
	if err != nil {
		return fmt.Errorf("directory for the API and worker processes: %w", err)
	}
	p := &Processes{dir: dir}
	s.Procs = p
	s.closers = append(s.closers, p.stop)
	if err := buildBinaries(ctx, dir, "sluice-api", "sluice-worker"); err != nil {
		return err
	}
	apiPort, err := testenv.FreePort()
	if err != nil {
		return err
	}
	workerPort, err := testenv.FreePort()
	if err != nil {
		return err
	}
	cfg := s.Config
	cfg.API.Addr = fmt.Sprintf("127.0.0.1:%d", apiPort)
	cfg.Metrics.Addr = ""
	cfg.Metrics.WorkerAddr = fmt.Sprintf("127.0.0.1:%d", workerPort)
	s.Config = cfg
	s.BaseURL = "http://" + cfg.API.Addr
	p.APIMetrics, p.WorkerMetrics = s.BaseURL+"/metrics", "http://"+cfg.Metrics.WorkerAddr+"/metrics"
	if p.Worker, err = testenv.NewProcess(dir, "worker", filepath.Join(dir, "sluice-worker"), cfg); err != nil {
		return err
	}
	if p.API, err = testenv.NewProcess(dir, "api", filepath.Join(dir, "sluice-api"), cfg); err != nil {
		return err
	}
	for _, proc := range []*testenv.Process{p.Worker, p.API} {
		if err := proc.Start(); err != nil {
			return err
		}
	}
	return p.awaitReady(ctx, s.BaseURL+"/readyz", 2*time.Minute)
}

// buildBinaries builds the named commands of cmd/ from this checkout
// into dir.
func buildBinaries(ctx context.Context, dir string, names ...string) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, "./cmd/"+n)
	}
	bctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(bctx, "go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %v: %w: %s", names, err, out)
	}
	return nil
}

// awaitReady waits until url answers 200, or either process exits.
func (p *Processes) awaitReady(ctx context.Context, url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	hc := &http.Client{Timeout: 2 * time.Second}
	for time.Now().Before(deadline) {
		for _, proc := range []*testenv.Process{p.Worker, p.API} {
			select {
			case <-proc.Exited():
				return fmt.Errorf("%s process exited while starting; its log (%s) ends:\n%s", proc.Name, proc.LogPath, testenv.Tail(proc.LogPath, 20))
			default:
			}
		}
		if resp, err := hc.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return errors.New("the API process was not ready within " + within.String() + "; its log: " + p.API.LogPath)
}

// stop ends the API first (it drains its streams), then the worker, and
// removes their directory.
func (p *Processes) stop() {
	for _, proc := range []*testenv.Process{p.API, p.Worker} {
		if proc != nil {
			proc.Stop()
		}
	}
	os.RemoveAll(p.dir)
}
