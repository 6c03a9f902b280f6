package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// The sluice-worker binary is built once per test binary, from this
// checkout, the first time a scenario needs a worker it can kill.
var (
	buildOnce sync.Once
	workerBin string
	buildErr  error
)

func buildWorker() (string, error) {
	buildOnce.Do(func() {
		root, err := testenv.RepoRoot()
		if err != nil {
			buildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "sluice-chaos-bin-")
		if err != nil {
			buildErr = err
			return
		}
		workerBin = filepath.Join(dir, "sluice-worker")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", workerBin, "./worker/cmd/sluice-worker")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build sluice-worker: %w: %s", err, out)
		}
	})
	return workerBin, buildErr
}

// workerProcess is a sluice-worker running as its own OS process, with
// the same configuration as the API (written to a YAML file it reads).
type workerProcess struct {
	t       *testing.T
	bin     string
	cfgPath string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
}

func newWorkerProcess(t *testing.T, cfg config.Config) *workerProcess {
	t.Helper()
	bin, err := buildWorker()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	raw, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatalf("write worker config: %v", err)
	}
	w := &workerProcess{t: t, bin: bin, cfgPath: filepath.Join(dir, "sluice.yaml"), logPath: filepath.Join(dir, "worker.log")}
	if err := os.WriteFile(w.cfgPath, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return w
}

// start runs the worker; its output is appended to its log file, one
// file across restarts.
func (w *workerProcess) start() error {
	logf, err := os.OpenFile(w.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(w.bin, "-config", w.cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The file is the whole configuration: a SLUICE_* variable of the
	// test's environment would override it, or stop the worker if the
	// config loader does not know it (SLUICE_CHAOS).
	cmd.Env = testenv.CleanEnv()
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start sluice-worker: %w", err)
	}
	w.cmd = cmd
	w.exited = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(w.exited)
	}()
	return nil
}

// kill sends SIGKILL: the worker dies mid-whatever, without a chance to
// finish an activity, release a permit or tell the server.
func (w *workerProcess) kill() error {
	if w.cmd == nil {
		return nil
	}
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill -9 sluice-worker %d: %w", w.cmd.Process.Pid, err)
	}
	<-w.exited
	w.cmd = nil
	return nil
}

// stop ends the worker gracefully (SIGTERM), or kills it after 20 s.
func (w *workerProcess) stop() {
	if w.cmd == nil {
		return
	}
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.exited:
	case <-time.After(20 * time.Second):
		_ = w.kill()
	}
	w.cmd = nil
}
