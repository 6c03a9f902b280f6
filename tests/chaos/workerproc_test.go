package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

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
		cmd := exec.CommandContext(ctx, "go", "build", "-o", workerBin, "./cmd/sluice-worker")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build sluice-worker: %w: %s", err, out)
		}
	})
	return workerBin, buildErr
}

// newWorkerProcess is a sluice-worker, built from this checkout, to run
// as its own OS process with the same configuration as the API.
func newWorkerProcess(t *testing.T, cfg config.Config) *testenv.Process {
	t.Helper()
	bin, err := buildWorker()
	if err != nil {
		t.Fatal(err)
	}
	w, err := testenv.NewProcess(t.TempDir(), "worker", bin, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
