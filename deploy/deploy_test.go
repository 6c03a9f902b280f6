// Package deploy holds Sluice's deployment files: a Dockerfile and a compose
// stack under docker/, the Helm chart under helm/. Nothing here
// starts a container; the test below checks the files against the code they
// deploy (binaries, routes, config, search attributes), so that a renamed
// flag or a moved package breaks `go test` rather than a deployment.
package deploy

import (
	"bufio"
	"fmt"
	"go/build"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/llmsim"
	"github.com/sluice-dev/sluice/workflows"
)

const (
	dockerfilePath = "docker/Dockerfile"
	composePath    = "docker/docker-compose.yaml"
)

// The commands the image must hold, by the name of their main package
// directory: sluice (built; its healthcheck), and the processes under
// their own names (links to sluice).
var wantBinaries = []string{"llmsim", "sluice", "sluice-api", "sluice-worker"}

// Dynamic config the Temporal server needs for eager start (see
// config.Temporal.EagerStart and deploy/dev/run.sh).
var wantDynamicConfig = []string{
	"system.enableEagerWorkflowStart=true",
	"system.enableActivityEagerExecution=true",
}

func TestDockerfile(t *testing.T) {
	df := parseDockerfile(t)
	if len(df.stages) < 2 {
		t.Fatalf("%s: want a multi-stage build, got %d stage(s)", dockerfilePath, len(df.stages))
	}
	if from := df.stages[0].from; !strings.HasPrefix(from, "golang:1.26") {
		t.Errorf("%s: builder stage is FROM %s, want golang:1.26 (go.mod's toolchain)", dockerfilePath, from)
	}
	final := df.stages[len(df.stages)-1]
	if final.user == "" || final.user == "root" || strings.HasPrefix(final.user, "0:") || final.user == "0" {
		t.Errorf("%s: runtime stage runs as %q, want a non-root USER", dockerfilePath, final.user)
	}
	// Distroless: CA certificates and passwd, no shell to RUN anything in.
	if !strings.HasPrefix(final.from, "gcr.io/distroless/static") || final.runs > 0 {
		t.Errorf("%s: runtime stage is FROM %s with %d RUN, want gcr.io/distroless/static and none", dockerfilePath, final.from, final.runs)
	}
	// The build's output folder whole, so that the links stay links.
	if !slices.Contains(final.copied, "out") {
		t.Errorf("%s: runtime stage does not COPY the build stage's /out/", dockerfilePath)
	}
	if len(final.cmd) == 0 || !slices.Contains(wantBinaries, final.cmd[0]) {
		t.Errorf("%s: CMD %q does not name one of %v", dockerfilePath, final.cmd, wantBinaries)
	}
	for _, env := range final.env {
		// An ENV SLUICE_* would beat every mounted config file.
		if strings.HasPrefix(env, config.EnvPrefix) {
			t.Errorf("%s: runtime stage sets %s; SLUICE_* overrides belong in compose or the chart", dockerfilePath, env)
		}
	}
}

// dockerBinaries returns the commands of the image: the binaries the
// Dockerfile builds, after checking that each go build target is a main
// package of this repository, and the links to sluice, each named after
// a command of this repository that sluice runs under that name
// (cmd/internal/cli's TestAliases).
func dockerBinaries(t *testing.T) []string {
	t.Helper()
	df := parseDockerfile(t)
	root := repoRoot(t)
	var bins []string
	for _, target := range df.buildTargets {
		dir := filepath.Join(root, filepath.FromSlash(target))
		pkg, err := build.ImportDir(dir, 0)
		if err != nil {
			t.Errorf("%s: go build target %s: %v", dockerfilePath, target, err)
			continue
		}
		if pkg.Name != "main" {
			t.Errorf("%s: go build target %s is package %s, not a command", dockerfilePath, target, pkg.Name)
			continue
		}
		bins = append(bins, filepath.Base(dir))
	}
	for _, link := range df.links {
		if pkg, err := build.ImportDir(filepath.Join(root, "cmd", link), 0); err != nil || pkg.Name != "main" {
			t.Errorf("%s: the link %s names no command under cmd/ (%v)", dockerfilePath, link, err)
		}
		// The image's other commands are sluice's too, but the files
		// the deployments name are these.
		if slices.Contains(wantBinaries, link) {
			bins = append(bins, link)
		}
	}
	sort.Strings(bins)
	if !slices.Equal(bins, wantBinaries) {
		t.Fatalf("%s builds %v, want %v", dockerfilePath, bins, wantBinaries)
	}
	return bins
}

func TestCompose(t *testing.T) {
	bins := dockerBinaries(t)
	cf := loadCompose(t)

	for _, name := range []string{"temporal", "redis", "llmsim", "sluice-worker", "sluice-api"} {
		if _, ok := cf.Services[name]; !ok {
			t.Errorf("%s: no service %q", composePath, name)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	for name, svc := range cf.Services {
		for dep, cond := range svc.DependsOn {
			target, ok := cf.Services[dep]
			if !ok {
				t.Errorf("%s: %s depends on unknown service %q", composePath, name, dep)
				continue
			}
			if cond == "service_healthy" && target.Healthcheck == nil {
				t.Errorf("%s: %s waits for %s to be healthy, but %s has no healthcheck", composePath, name, dep, dep)
			}
		}
		if svc.Build != nil {
			df := filepath.Join(filepath.Dir(composePath), svc.Build.Context, svc.Build.Dockerfile)
			if filepath.Clean(df) != filepath.Clean(filepath.Join("..", "deploy", dockerfilePath)) {
				t.Errorf("%s: %s builds %s, want deploy/%s", composePath, name, df, dockerfilePath)
			}
			if len(svc.Command) == 0 || !slices.Contains(bins, svc.Command[0]) {
				t.Errorf("%s: %s runs %q, want one of the image's binaries %v", composePath, name, svc.Command, bins)
			}
		}
		for _, ref := range envReferences(svc.Environment) {
			if _, ok := cf.Services[ref.host]; !ok {
				t.Errorf("%s: %s: %s=%s names host %q, which is no service", composePath, name, ref.key, svc.Environment[ref.key], ref.host)
			}
		}
	}
	for _, name := range []string{"temporal", "redis", "llmsim", "sluice-api"} {
		if cf.Services[name].Healthcheck == nil {
			t.Errorf("%s: %s has no healthcheck", composePath, name)
		}
	}

	checkComposeTemporal(t, cf.Services["temporal"])

	// Where each service listens inside its container.
	ports := map[string]string{
		"temporal": flagValue(cf.Services["temporal"].Command, "--port", "7233"),
		"redis":    flagValue(cf.Services["redis"].Command, "--port", "6379"),
	}
	simAddr := flagValue(cf.Services["llmsim"].Command, "-addr", llmsimDefaultAddr(t))
	ports["llmsim"] = checkListenAddr(t, "compose llmsim -addr", simAddr)
	checkHealthcheckURL(t, "llmsim", cf.Services["llmsim"], ports["llmsim"])

	for _, name := range []string{"sluice-api", "sluice-worker"} {
		cfg, err := config.Load("", cf.Services[name].Environment.environ())
		if err != nil {
			t.Errorf("%s: %s's environment does not load: %v", composePath, name, err)
			continue
		}
		checkDependencies(t, composePath+": "+name, cfg, false, func(host string) (string, bool) {
			port, ok := ports[host]
			return port, ok
		})
		if name == "sluice-worker" {
			checkWorkerHealthcheck(t, cf.Services[name], checkListenAddr(t, "compose sluice-worker metrics.worker_addr", cfg.Metrics.WorkerAddr))
		}
		if name == "sluice-api" {
			apiPort := checkListenAddr(t, "compose sluice-api api.addr", cfg.API.Addr)
			if apiPort != "8080" {
				t.Errorf("%s: sluice-api listens on %s, want 8080", composePath, apiPort)
			}
			checkHealthcheckURL(t, name, cf.Services[name], apiPort)
			checkAuthOff(t, composePath+": sluice-api", cfg)
			if v := cf.Services[name].Environment[config.EnvPrefix+"AUTH_ADMIN_KEY"]; !strings.HasPrefix(v, "${") {
				t.Errorf("%s: sluice-api's SLUICE_AUTH_ADMIN_KEY is %q; want it from the shell (${...}), never written in the file", composePath, v)
			}
			if !slices.Contains(publishedPorts(cf.Services[name]), apiPort+":"+apiPort) {
				t.Errorf("%s: sluice-api listens on %s but publishes %v, want %s:%s", composePath, apiPort, cf.Services[name].Ports, apiPort, apiPort)
			}
		}
	}
	for _, p := range []string{"7233:7233", "8233:8233"} {
		if !slices.Contains(publishedPorts(cf.Services["temporal"]), p) {
			t.Errorf("%s: temporal does not publish %s", composePath, p)
		}
	}
	// Only the API faces the network: Temporal, the simulator, Prometheus
	// and Grafana take no key, so they are published on loopback alone.
	for name, svc := range cf.Services {
		for _, p := range svc.Ports {
			if name != "sluice-api" && !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("%s: %s publishes %s on every interface, want 127.0.0.1:%s", composePath, name, p, p)
			}
		}
	}
}

// checkComposeTemporal checks that the dev server listens beyond loopback
// and carries the dynamic config and search attributes Sluice relies on.
func checkComposeTemporal(t *testing.T, svc composeService) {
	t.Helper()
	cmd := svc.Command
	if !strings.HasPrefix(svc.Image, "temporalio/") {
		t.Errorf("%s: temporal image %q is not an official temporalio image", composePath, svc.Image)
	}
	if len(cmd) < 2 || cmd[0] != "server" || cmd[1] != "start-dev" {
		t.Errorf("%s: temporal command %q does not start with `server start-dev`", composePath, cmd)
	}
	if ip := flagValue(cmd, "--ip", ""); ip != "0.0.0.0" {
		t.Errorf("%s: temporal --ip is %q, want 0.0.0.0 (other containers cannot reach loopback)", composePath, ip)
	}
	dyn := flagValues(cmd, "--dynamic-config-value")
	for _, want := range wantDynamicConfig {
		if !slices.Contains(dyn, want) {
			t.Errorf("%s: temporal lacks --dynamic-config-value %s", composePath, want)
		}
	}
	attrs := map[string]string{}
	for _, v := range flagValues(cmd, "--search-attribute") {
		name, typ, _ := strings.Cut(v, "=")
		attrs[name] = typ
	}
	for _, name := range workflows.SearchAttributeNames {
		if typ := attrs[name]; typ != "Keyword" {
			t.Errorf("%s: temporal registers search attribute %s as %q, want Keyword", composePath, name, typ)
		}
		delete(attrs, name)
	}
	for name := range attrs {
		if strings.HasPrefix(name, "Sluice") {
			t.Errorf("%s: temporal registers %s, which workflows.SearchAttributeNames does not list", composePath, name)
		}
	}
	if hc := svc.Healthcheck; hc != nil {
		addr := flagValue(hc.Test, "--address", "")
		if _, port, err := net.SplitHostPort(addr); err != nil || port != flagValue(cmd, "--port", "7233") {
			t.Errorf("%s: temporal healthcheck --address %q does not match the frontend port", composePath, addr)
		}
	}
}

// checkWorkerHealthcheck: the worker's healthcheck is `sluice healthcheck`
// of its metrics server's route, on the port metrics.worker_addr names.
func checkWorkerHealthcheck(t *testing.T, svc composeService, port string) {
	t.Helper()
	hc := svc.Healthcheck
	if hc == nil || len(hc.Test) != 5 || hc.Test[1] != "sluice" || hc.Test[2] != "healthcheck" || hc.Test[3] != "-url" {
		t.Errorf("%s: sluice-worker healthcheck %+v, want [CMD sluice healthcheck -url …]", composePath, hc)
		return
	}
	u, err := url.Parse(hc.Test[4])
	if err != nil || u.Port() != port {
		t.Errorf("%s: sluice-worker healthcheck asks %s, want port %s (%v)", composePath, hc.Test[4], port, err)
		return
	}
	checkMetricsServerRoute(t, composePath+": sluice-worker healthcheck", u.Path)
}

// checkHealthcheckURL checks that a compose healthcheck asks the service's
// own port for a route the binary serves.
func checkHealthcheckURL(t *testing.T, name string, svc composeService, port string) {
	t.Helper()
	if svc.Healthcheck == nil {
		return
	}
	var raw string
	for _, arg := range svc.Healthcheck.Test {
		if strings.HasPrefix(arg, "http://") {
			raw = arg
		}
	}
	if raw == "" {
		t.Errorf("%s: %s healthcheck %q has no http:// URL", composePath, name, svc.Healthcheck.Test)
		return
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Errorf("%s: %s healthcheck URL: %v", composePath, name, err)
		return
	}
	if u.Port() != port {
		t.Errorf("%s: %s healthcheck asks port %s, but the service listens on %s", composePath, name, u.Port(), port)
	}
	checkRoute(t, composePath+": "+name+" healthcheck", svc.Command[0], u.Path)
	// The image has no curl: its probe is its own binary's.
	if test := svc.Healthcheck.Test; len(test) < 3 || test[0] != "CMD" || test[1] != "sluice" || test[2] != "healthcheck" {
		t.Errorf("%s: %s healthcheck %q, want [CMD sluice healthcheck -url …] (the image has no curl)", composePath, name, test)
	}
}

func TestComposeConfigWithDocker(t *testing.T) {
	docker, err := exec.LookPath("docker")
	if err != nil {
		t.Skip("no docker binary")
	}
	if out, err := exec.Command(docker, "compose", "version").CombinedOutput(); err != nil {
		t.Skipf("no docker compose plugin (%v): %s", err, firstLine(out))
	}
	// `compose config` renders and validates the file against the Compose
	// schema; it should need no daemon, but skip rather than fail if it does.
	out, err := exec.Command(docker, "compose", "-f", composePath, "config", "-q").CombinedOutput()
	if err != nil && strings.Contains(string(out), "Cannot connect to the Docker daemon") {
		t.Skipf("docker compose config needs a daemon here: %s", firstLine(out))
	}
	if err != nil {
		t.Errorf("docker compose config: %v\n%s", err, out)
	}
}

func firstLine(b []byte) string {
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return line
}

// checkAuthOff checks that a deployment refuses requests without a key
// and writes no credential in plain text: configured keys and the admin
// key by their hashes only (the admin key may come from the environment).
func checkAuthOff(t *testing.T, what string, cfg config.Config) {
	t.Helper()
	if cfg.Auth.AllowAnonymous {
		t.Errorf("%s: auth.allow_anonymous is on; deployments need keys", what)
	}
	for i, k := range cfg.Auth.APIKeys {
		if k.Key != "" {
			t.Errorf("%s: auth.api_keys[%d] is a plain key; use key_sha256", what, i)
		}
	}
}

// checkDependencies checks where cfg points Sluice: never at loopback (in a
// container that is the container itself, usually a config default left in
// place), the LLM pools at services of the stack (the simulator) on their
// port, and Temporal and Redis at services of the stack too unless they are
// external. port reports a service's port by host name.
func checkDependencies(t *testing.T, what string, cfg config.Config, externalStores bool, port func(host string) (string, bool)) {
	t.Helper()
	type dep struct {
		field, addr string
		inStack     bool
	}
	deps := []dep{{"temporal.host_port", cfg.Temporal.HostPort, !externalStores}}
	// Redis is one address, a Cluster's seeds, a URL or Sentinels: each
	// must name a service of the stack (or, externalStores, none).
	switch r := cfg.Redis; {
	case r.Addr != "":
		deps = append(deps, dep{"redis.addr", r.Addr, !externalStores})
	case r.URL != "":
		if u, err := url.Parse(r.URL); err != nil {
			t.Errorf("%s: redis.url %q: %v", what, r.URL, err)
		} else {
			deps = append(deps, dep{"redis.url", u.Host, !externalStores})
		}
	}
	for i, a := range cfg.Redis.Addrs {
		deps = append(deps, dep{fmt.Sprintf("redis.addrs[%d]", i), a, !externalStores})
	}
	for i, a := range cfg.Redis.Sentinel.Addrs {
		deps = append(deps, dep{fmt.Sprintf("redis.sentinel.addrs[%d]", i), a, !externalStores})
	}
	for i, e := range cfg.Pools.Short.Endpoints {
		deps = append(deps, dep{fmt.Sprintf("pools.short.endpoints[%d]", i), e, true})
	}
	for i, e := range cfg.Pools.Long.Endpoints {
		deps = append(deps, dep{fmt.Sprintf("pools.long.endpoints[%d]", i), e, true})
	}
	for _, d := range deps {
		host, p, err := splitAddr(d.addr)
		if err != nil {
			t.Errorf("%s: %s %q: %v", what, d.field, d.addr, err)
			continue
		}
		if isLoopback(host) {
			t.Errorf("%s: %s is %s, the container itself", what, d.field, d.addr)
			continue
		}
		want, known := port(host)
		switch {
		case d.inStack && !known:
			t.Errorf("%s: %s %s names no service of the stack", what, d.field, d.addr)
		case !d.inStack && known:
			t.Errorf("%s: %s %s names a service of this stack, but it is meant to be external", what, d.field, d.addr)
		case known && p != want:
			t.Errorf("%s: %s %s uses port %s, but %s listens on %s", what, d.field, d.addr, p, host, want)
		}
	}
}

// checkListenAddr checks that a listen address is reachable from outside
// its container and returns its port.
func checkListenAddr(t *testing.T, what, addr string) string {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s %q: %v", what, addr, err)
		return ""
	}
	if host != "" && host != "0.0.0.0" && host != "::" {
		t.Errorf("%s is %s; in a container listen on 0.0.0.0", what, addr)
	}
	return port
}

// checkRoute checks that binary serves GET path.
func checkRoute(t *testing.T, what, binary, path string) {
	t.Helper()
	switch binary {
	case "sluice-api":
		// Building the API server needs live Temporal and Redis clients, so
		// its routes are read from its Echo registrations instead.
		if routes := apiGETRoutes(t); !slices.Contains(routes, path) {
			t.Errorf("%s: sluice-api serves no GET %s (it serves %v)", what, path, routes)
		}
	case "llmsim":
		sim, err := llmsim.New(llmsim.DefaultConfig(), slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatalf("start llmsim: %v", err)
		}
		defer sim.Close()
		rec := httptest.NewRecorder()
		sim.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK {
			t.Errorf("%s: llmsim answers GET %s with %d, want 200", what, path, rec.Code)
		}
	default:
		t.Errorf("%s: %s serves no HTTP", what, binary)
	}
}

var echoGET = regexp.MustCompile(`\.GET\("(/[^"]*)"`)

func apiGETRoutes(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "api", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var routes []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range echoGET.FindAllStringSubmatch(string(src), -1) {
			routes = append(routes, m[1])
		}
	}
	return routes
}

var llmsimAddrFlag = regexp.MustCompile(`fs\.String\("addr", "([^"]+)"`)

// llmsimDefaultAddr reads the default of llmsim's -addr flag from its
// source (cmd/internal/llmsimcli, which the llmsim command runs).
func llmsimDefaultAddr(t *testing.T) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot(t), "cmd", "internal", "llmsimcli", "llmsim.go"))
	if err != nil {
		t.Fatal(err)
	}
	m := llmsimAddrFlag.FindStringSubmatch(string(src))
	if m == nil {
		t.Fatal("llmsimcli/llmsim.go: cannot find the -addr flag's default")
	}
	return m[1]
}

type dockerfile struct {
	stages       []dockerStage
	buildTargets []string
	// links are the names the build stage links to the sluice binary
	// (`for alias in …; do ln -s sluice …`).
	links []string
}

type dockerStage struct {
	from   string
	user   string
	copied []string
	cmd    []string
	env    []string
	runs   int
}

func parseDockerfile(t *testing.T) dockerfile {
	t.Helper()
	raw, err := os.ReadFile(dockerfilePath)
	if err != nil {
		t.Fatal(err)
	}
	var df dockerfile
	for _, line := range dockerInstructions(string(raw)) {
		instr, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		var stage *dockerStage
		if len(df.stages) > 0 {
			stage = &df.stages[len(df.stages)-1]
		}
		switch strings.ToUpper(instr) {
		case "FROM":
			df.stages = append(df.stages, dockerStage{from: strings.Fields(rest)[0]})
		case "USER":
			stage.user = rest
		case "ENV":
			stage.env = append(stage.env, rest)
		case "CMD":
			if err := yaml.Unmarshal([]byte(rest), &stage.cmd); err != nil {
				t.Errorf("%s: CMD %s is not exec (JSON) form: %v", dockerfilePath, rest, err)
			}
		case "COPY":
			if strings.Contains(rest, "--from=") {
				fields := strings.Fields(rest)
				for _, src := range fields[1 : len(fields)-1] {
					if !strings.HasPrefix(src, "--") {
						stage.copied = append(stage.copied, filepath.Base(src))
					}
				}
			}
		case "RUN":
			stage.runs++
			if _, loop, ok := strings.Cut(rest, "for alias in "); ok && strings.Contains(loop, "ln -s sluice ") {
				words, _, _ := strings.Cut(loop, ";")
				df.links = append(df.links, strings.Fields(words)...)
			}
			_, after, ok := strings.Cut(rest, "go build")
			if !ok {
				continue
			}
			after, _, _ = strings.Cut(after, "&&")
			for _, f := range strings.Fields(after) {
				if strings.HasPrefix(f, "./") {
					df.buildTargets = append(df.buildTargets, f)
				}
			}
		}
	}
	if len(df.buildTargets) == 0 {
		t.Fatalf("%s: no go build of ./... targets", dockerfilePath)
	}
	return df
}

// dockerInstructions joins continued lines and drops comments.
func dockerInstructions(src string) []string {
	var out []string
	var cur strings.Builder
	sc := bufio.NewScanner(strings.NewReader(src))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(line)
		out = append(out, cur.String())
		cur.Reset()
	}
	return out
}

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Command     stringList `yaml:"command"`
	Environment envMap     `yaml:"environment"`
	Ports       []string   `yaml:"ports"`
	DependsOn   dependsOn  `yaml:"depends_on"`
	Healthcheck *struct {
		Test stringList `yaml:"test"`
	} `yaml:"healthcheck"`
	Volumes []string `yaml:"volumes"`
}

// stringList is a compose command: a list, or a string split on spaces.
type stringList []string

func (s *stringList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*s = strings.Fields(n.Value)
		return nil
	}
	var list []string
	err := n.Decode(&list)
	*s = list
	return err
}

// envMap is a compose environment: a mapping, or a list of KEY=VALUE.
type envMap map[string]string

func (e *envMap) UnmarshalYAML(n *yaml.Node) error {
	m := map[string]string{}
	if n.Kind == yaml.SequenceNode {
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		for _, kv := range list {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
	} else if err := n.Decode(&m); err != nil {
		return err
	}
	*e = m
	return nil
}

func (e envMap) environ() []string {
	var env []string
	for k, v := range e {
		env = append(env, k+"="+v)
	}
	return env
}

// dependsOn maps each dependency to its condition ("" in the list form).
type dependsOn map[string]string

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	m := map[string]string{}
	if n.Kind == yaml.SequenceNode {
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		for _, name := range list {
			m[name] = ""
		}
	} else {
		var long map[string]struct {
			Condition string `yaml:"condition"`
		}
		if err := n.Decode(&long); err != nil {
			return err
		}
		for name, v := range long {
			m[name] = v.Condition
		}
	}
	*d = m
	return nil
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	raw, err := os.ReadFile(composePath)
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("parse %s: %v", composePath, err)
	}
	return cf
}

type envRef struct{ key, host string }

// listenKeys are settings that name an address to listen on, not a peer.
var listenKeys = []string{config.EnvPrefix + "API_ADDR", config.EnvPrefix + "METRICS_ADDR", config.EnvPrefix + "METRICS_WORKER_ADDR"}

// envReferences returns the hosts that environment values point at: the
// host of every URL, and of every host:port in an *_ADDR or *_HOST_PORT.
func envReferences(env envMap) []envRef {
	var refs []envRef
	for key, value := range env {
		if slices.Contains(listenKeys, key) {
			continue
		}
		for _, part := range strings.Split(value, ",") {
			part = strings.TrimSpace(part)
			switch {
			case strings.Contains(part, "://"):
				if u, err := url.Parse(part); err == nil && u.Hostname() != "" {
					refs = append(refs, envRef{key, u.Hostname()})
				}
			case strings.HasSuffix(key, "_ADDR") || strings.HasSuffix(key, "_HOST_PORT"):
				if host, _, err := net.SplitHostPort(part); err == nil {
					refs = append(refs, envRef{key, host})
				}
			}
		}
	}
	return refs
}

func publishedPorts(svc composeService) []string {
	var out []string
	for _, p := range svc.Ports {
		p, _, _ = strings.Cut(p, "/")
		parts := strings.Split(p, ":")
		if len(parts) == 1 {
			out = append(out, parts[0]+":"+parts[0])
			continue
		}
		out = append(out, parts[len(parts)-2]+":"+parts[len(parts)-1])
	}
	return out
}

// clusterServiceName maps "svc", "svc.ns" and "svc.ns.svc.cluster.local"
// in namespace ns to svc; other hosts map to themselves.
func clusterServiceName(host, ns string) string {
	parts := strings.Split(host, ".")
	if len(parts) == 1 || (len(parts) >= 2 && parts[1] == ns) {
		return parts[0]
	}
	return host
}

func labelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// flagValues returns every value of flag in args, in "-f v" or "-f=v" form.
func flagValues(args []string, flag string) []string {
	var out []string
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			out = append(out, args[i+1])
		} else if v, ok := strings.CutPrefix(a, flag+"="); ok {
			out = append(out, v)
		}
	}
	return out
}

// flagValue returns the last value of flag in args, or def.
func flagValue(args []string, flag, def string) string {
	if v := flagValues(args, flag); len(v) > 0 {
		return v[len(v)-1]
	}
	return def
}

// splitAddr returns host and port of "host:port" or of an http(s) URL.
func splitAddr(addr string) (string, string, error) {
	if !strings.Contains(addr, "://") {
		return net.SplitHostPort(addr)
	}
	u, err := url.Parse(addr)
	if err != nil {
		return "", "", err
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return u.Hostname(), port, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}

// repoRoot is the module root; tests run in deploy/.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("module root: %v", err)
	}
	return dir
}
