package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"
)

// stopGrace is how long Stop waits for a process to end after SIGTERM
// before it kills it.
const stopGrace = 20 * time.Second

// Process is a Sluice binary (sluice-api, sluice-worker) running as its
// own OS process, configured by a YAML file, that a test can kill -9 and
// start again: same configuration, same log file, an API on the same
// address.
type Process struct {
	Name string
	// LogPath is the file its output is appended to, across restarts.
	LogPath string
	bin     string
	cfgPath string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// NewProcess writes cfg as name.yaml in dir for bin, to run as Start
// says; its log will be name.log in dir. cfg is a config.Config, taken
// as any because packages that pkg/config imports use testenv in their
// own tests.
func NewProcess(dir, name, bin string, cfg any) (*Process, error) {
	raw, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("encode %s config: %w", name, err)
	}
	p := &Process{Name: name, bin: bin, cfgPath: filepath.Join(dir, name+".yaml"), LogPath: filepath.Join(dir, name+".log")}
	if err := os.WriteFile(p.cfgPath, raw, 0o600); err != nil {
		return nil, fmt.Errorf("write %s config: %w", name, err)
	}
	return p, nil
}

// Start runs the process.
func (p *Process) Start() error {
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("open %s log: %w", p.Name, err)
	}
	cmd := exec.Command(p.bin, "-config", p.cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The file is the whole configuration: a SLUICE_* variable of the
	// test's environment would override it, or stop the process if the
	// config loader does not know it (a test's own switch).
	cmd.Env = CleanEnv()
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	p.cmd = cmd
	exited := make(chan struct{})
	p.exited = exited
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(exited)
	}()
	return nil
}

// Pid is the process's id while it runs, else 0.
func (p *Process) Pid() int {
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the process was started and not killed or
// stopped since.
func (p *Process) Running() bool { return p.cmd != nil }

// Exited is closed when the process started last ends by itself or
// otherwise.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Kill sends SIGKILL: the process dies mid-whatever, without closing a
// stream, finishing an activity or releasing a permit.
func (p *Process) Kill() error {
	if p.cmd == nil {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill -9 %s (%d): %w", p.Name, p.cmd.Process.Pid, err)
	}
	<-p.exited
	p.cmd = nil
	return nil
}

// Stop ends the process gracefully (SIGTERM), or kills it after
// stopGrace.
func (p *Process) Stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(stopGrace):
		_ = p.Kill()
	}
	p.cmd = nil
}
