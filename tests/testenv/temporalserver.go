package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TemporalServer is the real Temporal server (not the CLI's dev server) on
// a PostgreSQL of its own, configured as `make run-cluster` configures it:
// deploy/cluster/temporal/cluster.yaml and dynamicconfig.yaml (history and
// SQL visibility on PostgreSQL, four history shards, every service in one
// process on loopback, the dynamic config Sluice relies on), namespace
// "default" registered.
//
// It needs three programs, each found at the path in its variable or else
// at the repository's bin/:
//
//	bin/temporal-server    $SLUICE_TEST_TEMPORAL_SERVER_BIN  make temporal-server (go.temporal.io/server/cmd/server@v1.29.1)
//	bin/temporal-sql-tool  $SLUICE_TEST_TEMPORAL_SQL_TOOL    make temporal-server (go.temporal.io/server/cmd/tools/sql@v1.29.1)
//
// and PostgreSQL's initdb and pg_ctl, on PATH or under
// /usr/lib/postgresql/*/bin (apt-get install postgresql). PostgreSQL will
// not run as root: as root its processes run as the user postgres.
type TemporalServer struct {
	// HostPort is the frontend's gRPC address; PGAddr PostgreSQL's
	// (user postgres, no password: trust on loopback).
	HostPort string
	PGAddr   string

	pg     *Postgres
	srv    *exec.Cmd
	exited chan struct{}
}

// LaunchTemporalServer starts PostgreSQL and the Temporal server on free
// loopback ports, sets up both schemas with temporal-sql-tool, registers
// namespace "default" and the given Keyword search attributes in it, and
// returns once a client can use it. The server's and the tools' output
// goes to log. The caller must Stop it.
func LaunchTemporalServer(ctx context.Context, keywordAttrs []string, log io.Writer) (s *TemporalServer, err error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	serverBin, err := tsRepoBin(root, "SLUICE_TEST_TEMPORAL_SERVER_BIN", "temporal-server", "make temporal-server")
	if err != nil {
		return nil, err
	}
	sqlTool, err := tsRepoBin(root, "SLUICE_TEST_TEMPORAL_SQL_TOOL", "temporal-sql-tool", "make temporal-server")
	if err != nil {
		return nil, err
	}
	// Ports 6-9 are the services' membership ports, which PostgreSQL's
	// cluster_membership table keeps as a SMALLINT: below 32768, so
	// not from the kernel's ephemeral range.
	var ports [10]int
	for i := range ports {
		if i < 6 {
			ports[i], err = FreePort()
		} else {
			ports[i], err = tsLowFreePort(ports[6:i])
		}
		if err != nil {
			return nil, err
		}
	}
	s = &TemporalServer{HostPort: fmt.Sprintf("127.0.0.1:%d", ports[1]), PGAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]),
		exited: make(chan struct{})}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()

	if s.pg, err = StartPostgres(ctx, ports[0], log); err != nil {
		return s, err
	}

	// Both schemas, as deploy/cluster/run.sh sets them up.
	for _, db := range []struct{ name, schema string }{{"temporal", "postgresql/v12/temporal"}, {"temporal_visibility", "postgresql/v12/visibility"}} {
		base := []string{"--plugin", "postgres12", "--ep", "127.0.0.1", "-p", strconv.Itoa(ports[0]), "-u", "postgres", "--db", db.name}
		for _, step := range [][]string{{"create-database"}, {"setup-schema", "-v", "0.0"}, {"update-schema", "--schema-name", db.schema}} {
			if err := tsRun(ctx, log, nil, sqlTool, append(base, step...)...); err != nil {
				return s, fmt.Errorf("temporal-sql-tool %s %s: %w", db.name, step[0], err)
			}
		}
	}

	// The server, rendering deploy/cluster/temporal/cluster.yaml from TS_*.
	cfgDir := filepath.Join(root, "deploy", "cluster", "temporal")
	s.srv = exec.Command(serverBin, "--root", "/", "--config", cfgDir, "--env", "cluster", "--allow-no-auth", "start")
	s.srv.Env = append(os.Environ(),
		"TS_PG_ADDR="+s.PGAddr, "TS_PG_USER=postgres", "TS_PG_PASSWORD=unused",
		"TS_FRONTEND_PORT="+strconv.Itoa(ports[1]), "TS_FRONTEND_HTTP_PORT="+strconv.Itoa(ports[2]),
		"TS_HISTORY_PORT="+strconv.Itoa(ports[3]), "TS_MATCHING_PORT="+strconv.Itoa(ports[4]), "TS_WORKER_PORT="+strconv.Itoa(ports[5]),
		"TS_FRONTEND_MEMBERSHIP_PORT="+strconv.Itoa(ports[6]), "TS_HISTORY_MEMBERSHIP_PORT="+strconv.Itoa(ports[7]),
		"TS_MATCHING_MEMBERSHIP_PORT="+strconv.Itoa(ports[8]), "TS_WORKER_MEMBERSHIP_PORT="+strconv.Itoa(ports[9]),
		"TS_DYNAMIC_CONFIG="+filepath.Join(cfgDir, "dynamicconfig.yaml"), "TS_LOG_LEVEL=warn")
	s.srv.Stdout, s.srv.Stderr = log, log
	if err := s.srv.Start(); err != nil {
		s.srv = nil
		return s, fmt.Errorf("start %s: %w", serverBin, err)
	}
	go func() { _ = s.srv.Wait(); close(s.exited) }()

	return s, s.register(ctx, keywordAttrs)
}

// Postgres is the cluster the server keeps its databases in, for a test
// that wants a database of its own beside them.
func (s *TemporalServer) Postgres() *Postgres { return s.pg }

// register waits for the frontend, registers namespace default and the
// search attributes, and waits until the namespace can be used.
func (s *TemporalServer) register(ctx context.Context, keywordAttrs []string) error {
	c, err := client.NewLazyClient(client.Options{HostPort: s.HostPort, Namespace: "default"})
	if err != nil {
		return err
	}
	defer c.Close()
	retry := func(what string, f func(ctx context.Context) error) error {
		for {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := f(cctx)
			cancel()
			if err == nil {
				return nil
			}
			select {
			case <-s.exited:
				return fmt.Errorf("temporal server exited while waiting for %s (see its log): %w", what, err)
			case <-ctx.Done():
				return fmt.Errorf("%s: %w", what, err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	if err := retry("frontend health", func(ctx context.Context) error {
		_, err := c.CheckHealth(ctx, &client.CheckHealthRequest{})
		return err
	}); err != nil {
		return err
	}
	if err := retry("register namespace default", func(ctx context.Context) error {
		_, err := c.WorkflowService().RegisterNamespace(ctx, &workflowservice.RegisterNamespaceRequest{
			Namespace: "default", WorkflowExecutionRetentionPeriod: durationpb.New(72 * time.Hour)})
		var exists *serviceerror.NamespaceAlreadyExists
		if errors.As(err, &exists) {
			return nil
		}
		return err
	}); err != nil {
		return err
	}
	if len(keywordAttrs) > 0 {
		attrs := make(map[string]enumspb.IndexedValueType, len(keywordAttrs))
		for _, name := range keywordAttrs {
			attrs[name] = enumspb.INDEXED_VALUE_TYPE_KEYWORD
		}
		if err := retry("add search attributes", func(ctx context.Context) error {
			_, err := c.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
				Namespace: "default", SearchAttributes: attrs})
			return err
		}); err != nil {
			return err
		}
	}
	return retry("namespace default usable", func(ctx context.Context) error {
		_, err := c.CountWorkflow(ctx, &workflowservice.CountWorkflowExecutionsRequest{Namespace: "default"})
		return err
	})
}

// Stop stops the server (SIGTERM; SIGKILL after 30s), then PostgreSQL,
// and removes PostgreSQL's directory. Stopping twice does nothing.
func (s *TemporalServer) Stop() error {
	var errs []error
	if s.srv != nil {
		_ = s.srv.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			_ = s.srv.Process.Kill()
			<-s.exited
			errs = append(errs, fmt.Errorf("temporal server on %s did not stop in 30s: killed", s.HostPort))
		}
		s.srv = nil
	}
	errs = append(errs, s.pg.Stop())
	return errors.Join(errs...)
}

func tsRun(ctx context.Context, log io.Writer, attr *syscall.SysProcAttr, bin string, args ...string) error {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = attr
	cmd.Dir = os.TempDir()
	return cmd.Run()
}

// tsLowFreePort finds a free loopback port in [20000, 32000), not one of
// taken.
func tsLowFreePort(taken []int) (int, error) {
	for range 200 {
		p := 20000 + rand.IntN(12000)
		if slices.Contains(taken, p) {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		l.Close()
		return p, nil
	}
	return 0, fmt.Errorf("no free port in [20000, 32000)")
}

// tsRepoBin is the program named by the variable env, or bin/name.
func tsRepoBin(root, env, name, how string) (string, error) {
	if p := os.Getenv(env); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", env, p, err)
		}
		return p, nil
	}
	p := filepath.Join(root, "bin", name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s not found at %s: run `%s`", name, p, how)
	}
	return p, nil
}

func tsFileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
