package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Postgres is a throwaway PostgreSQL cluster from Debian's binaries
// (apt-get install postgresql): a data dir of its own under the temp dir,
// listening on one loopback port, user postgres with no password (trust
// on loopback). PostgreSQL will not run as root: as root its processes
// run as the user postgres. The caller must Stop it.
type Postgres struct {
	// Addr is host:port.
	Addr string

	bin  string
	dir  string // the data dir and the log, removed by Stop
	cred *syscall.Credential
}

// ErrNoPostgres says PostgreSQL's programs are not installed; tests that
// need it may skip on it.
var ErrNoPostgres = errors.New("PostgreSQL's initdb and pg_ctl not found on PATH or in /usr/lib/postgresql/*/bin (apt-get install postgresql)")

// StartPostgres initialises and starts a cluster on port (0: a free one)
// and returns once it accepts connections.
func StartPostgres(ctx context.Context, port int, log io.Writer) (p *Postgres, err error) {
	bin, err := tsPostgresBinDir()
	if err != nil {
		return nil, err
	}
	if port == 0 {
		if port, err = FreePort(); err != nil {
			return nil, err
		}
	}
	p = &Postgres{Addr: fmt.Sprintf("127.0.0.1:%d", port), bin: bin}
	defer func() {
		if err != nil {
			_ = p.Stop()
		}
	}()
	// A test's TempDir is not open to the postgres user.
	if p.dir, err = os.MkdirTemp("", "sluice-pg-"); err != nil {
		return p, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return p, fmt.Errorf("running as root, PostgreSQL needs the user postgres (apt-get install postgresql makes it): %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(p.dir, uid, gid); err != nil {
			return p, err
		}
	}
	data := filepath.Join(p.dir, "data")
	if err := p.run(ctx, log, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "-N"); err != nil {
		return p, err
	}
	if err := p.run(ctx, log, "pg_ctl", "-D", data, "-l", filepath.Join(p.dir, "postgres.log"), "-w", "-t", "60",
		"-o", fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories=''", port), "start"); err != nil {
		return p, err
	}
	return p, nil
}

// CreateDatabase creates database name.
func (p *Postgres) CreateDatabase(ctx context.Context, name string) error {
	host, port := splitAddr(p.Addr)
	return p.run(ctx, io.Discard, "createdb", "-h", host, "-p", port, "-U", "postgres", name)
}

// DSN is a postgres:// URL of database db.
func (p *Postgres) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", p.Addr, db)
}

// Stop stops the cluster and removes its directory. Stopping twice does
// nothing.
func (p *Postgres) Stop() error {
	if p == nil || p.dir == "" {
		return nil
	}
	var errs []error
	data := filepath.Join(p.dir, "data")
	if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		errs = append(errs, p.run(ctx, io.Discard, "pg_ctl", "-D", data, "-m", "fast", "-w", "stop"))
		cancel()
	}
	errs = append(errs, os.RemoveAll(p.dir))
	p.dir = ""
	return errors.Join(errs...)
}

// run runs one of PostgreSQL's programs, as the user postgres when we
// are root.
func (p *Postgres) run(ctx context.Context, log io.Writer, prog string, args ...string) error {
	attr := &syscall.SysProcAttr{Setsid: true, Credential: p.cred}
	if err := tsRun(ctx, log, attr, filepath.Join(p.bin, prog), args...); err != nil {
		return fmt.Errorf("%s: %w", prog, err)
	}
	return nil
}

func splitAddr(addr string) (host, port string) {
	for i := len(addr) - 1; i >= 0; i-- {
		if addr[i] == ':' {
			return addr[:i], addr[i+1:]
		}
	}
	return addr, ""
}

// tsPostgresBinDir finds initdb and pg_ctl: on PATH (where the folder
// they link to has PostgreSQL's other programs too), or in the newest
// /usr/lib/postgresql/*/bin (Debian keeps them off PATH).
func tsPostgresBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if dir := filepath.Dir(p); tsFileExists(filepath.Join(dir, "pg_ctl")) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return tsPGMajor(dirs[i]) < tsPGMajor(dirs[j]) })
	for i := len(dirs) - 1; i >= 0; i-- {
		if tsFileExists(filepath.Join(dirs[i], "initdb")) && tsFileExists(filepath.Join(dirs[i], "pg_ctl")) {
			return dirs[i], nil
		}
	}
	return "", ErrNoPostgres
}

func tsPGMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// SharedPostgres is a test package's one throwaway PostgreSQL cluster,
// started by the first test that needs it; the package's TestMain stops
// it.
type SharedPostgres struct {
	once sync.Once
	srv  *Postgres
	err  error
}

// Get is the cluster, started on first use. Where PostgreSQL is not
// installed it skips t, saying so.
func (s *SharedPostgres) Get(t testing.TB) *Postgres {
	t.Helper()
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var log bytes.Buffer
		if s.srv, s.err = StartPostgres(ctx, 0, &log); s.err != nil {
			s.err = fmt.Errorf("%w\n%s", s.err, log.String())
		}
	})
	if errors.Is(s.err, ErrNoPostgres) {
		t.Skip("PostgreSQL is not installed (apt-get install postgresql): ", s.err)
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.srv
}

// Stop stops the cluster, if a test started it.
func (s *SharedPostgres) Stop() error { return s.srv.Stop() }

// Run runs a package's tests (its TestMain's m), then stops the cluster
// if one of them started it: func TestMain(m *testing.M) { os.Exit(pg.Run(m)) }.
func (s *SharedPostgres) Run(m *testing.M) int {
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop postgres:", err)
	}
	return code
}

// NewDatabase creates a database of its own for t, named from prefix,
// and returns its DSN.
func (s *SharedPostgres) NewDatabase(t testing.TB, prefix string) string {
	t.Helper()
	srv := s.Get(t)
	name := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	if err := srv.CreateDatabase(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	return srv.DSN(name)
}
