package replay

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/sluice-dev/sluice/pkg/codec"
	"github.com/sluice-dev/sluice/tests/testenv"
)

// oldSides lists, for every change id of a workflow.GetVersion call in
// workflows/, the recorded histories (paths under tests/histories) that
// exercise the old side of its branch: they reach the call without
// carrying its marker, so replaying them runs the code that workflows
// started before the change still run. A deployed release may have such
// workflows open, so a branch whose old side no history replays could
// break them unseen. Record the history on the release before the change
// (or keep one recorded then), and list it here with the change.
var oldSides = map[string][]string{
	// Recorded on ea0fc80, before the change, by a one-off integration
	// run: the long pool's permits held, its requests timing out queued
	// (100 %), a healthy tail; the healer shrank it (SetPermits long=2).
	"spare-starved-pools": {"healing_starved_pool.json"},
	// The same history: the healer's first critical poll reaches the
	// check whatever made the pool critical.
	"heal-by-client-slo": {"healing_starved_pool.json"},
	// Recorded before the usage ledger: an answered request, a cancelled
	// one and one that timed out in the queue each end without its
	// marker (and record nothing).
	"usage-ledger": {"chat_done.json", "chat_cancel_signal.json", "chat_queue_timeout.json"},
	// Recorded before pool fallbacks: a stream cancelled by the client's
	// signal and one whose client went away each fail the LLM activity,
	// which reaches the fallback's check without its marker.
	"pool-fallbacks": {"chat_cancel_signal.json", "chat_disconnected.json"},
}

// Every GetVersion branch in workflows/ has a listed history that replays
// through its old side, and every listed change id is still in the code.
func TestEveryVersionBranchHasAnOldSideHistory(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ids, err := changeIDs(filepath.Join(root, "workflows"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range versionProblems(root, ids, oldSides) {
		t.Error(p)
	}
}

// The check is real with no branch left: it finds the change ids of a
// workflow package that has branches, and fails a change id without a
// listed history or with one that never reaches its GetVersion.
func TestVersionCheckFailsABranchWithoutHistory(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ids, err := changeIDs(filepath.Join("testdata", "versioned"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"by-constant", "literal-change", "with-options"}; !slices.Equal(ids, want) {
		t.Fatalf("change ids %v, want %v", ids, want)
	}
	problems := versionProblems(root, []string{"literal-change", "by-constant"}, map[string][]string{
		"by-constant": {"chat_done.json"},
		"gone-change": {"chat_done.json"},
	})
	want := []string{
		`GetVersion("by-constant"): chat_done.json never reaches it`,
		`GetVersion("literal-change"): no history in oldSides exercises its old side`,
		`oldSides lists "gone-change", which no GetVersion in workflows/ uses any more`,
	}
	if len(problems) != len(want) {
		t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(problems, "\n"), strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(problems[i], want[i]) {
			t.Errorf("problem %d: %q, want it to start with %q", i, problems[i], want[i])
		}
	}
}

// changeIDs returns the sorted change ids of every workflow.GetVersion and
// GetVersionWithOptions call in the non-test Go files of dir. A change id
// must be a string literal or a constant declared in the package with one:
// anything else is an error, since the check could not see it.
func changeIDs(dir string) ([]string, error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var files []*ast.File
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", name, err)
		}
		files = append(files, f)
	}
	consts := stringConsts(files)
	seen := map[string]bool{}
	var errs []string
	for _, f := range files {
		pkg := importName(f, "go.temporal.io/sdk/workflow")
		if pkg == "" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "GetVersion" && sel.Sel.Name != "GetVersionWithOptions") {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != pkg {
				return true
			}
			id, ok := stringValue(call.Args[1], consts)
			if !ok {
				errs = append(errs, fmt.Sprintf("%s: the change id of %s is not a constant string", fset.Position(call.Pos()), sel.Sel.Name))
				return true
			}
			seen[id] = true
			return true
		})
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// importName is the name f refers to the package path by, "" when it does
// not import it.
func importName(f *ast.File, path string) string {
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == path {
			if imp.Name != nil {
				return imp.Name.Name
			}
			return filepath.Base(path)
		}
	}
	return ""
}

// stringConsts maps the package's constants declared with a string
// literal to their values.
func stringConsts(files []*ast.File) map[string]string {
	out := map[string]string{}
	for _, f := range files {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						if v, err := strconv.Unquote(lit.Value); err == nil {
							out[name.Name] = v
						}
					}
				}
			}
		}
	}
	return out
}

func stringValue(e ast.Expr, consts map[string]string) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		v, err := strconv.Unquote(e.Value)
		return v, err == nil
	case *ast.Ident:
		v, ok := consts[e.Name]
		return v, ok
	}
	return "", false
}

// versionProblems checks ids (the change ids in the code) against listed
// (change id → histories): every id needs a listed history whose replay
// calls its GetVersion and gets workflow.DefaultVersion, the old side; and
// every listed id must still be in the code. Sorted by change id.
func versionProblems(root string, ids []string, listed map[string][]string) []string {
	var problems []string
	for _, id := range ids {
		files := listed[id]
		if len(files) == 0 {
			problems = append(problems, fmt.Sprintf("GetVersion(%q): no history in oldSides exercises its old side; list one recorded before the change (see docs/testing.md)", id))
			continue
		}
		for _, f := range files {
			versions, err := replayVersions(root, f)
			switch {
			case err != nil:
				problems = append(problems, fmt.Sprintf("GetVersion(%q): %s: %v", id, f, err))
			case len(versions[id]) == 0:
				problems = append(problems, fmt.Sprintf("GetVersion(%q): %s never reaches it", id, f))
			case !slices.Contains(versions[id], workflow.DefaultVersion):
				problems = append(problems, fmt.Sprintf("GetVersion(%q): %s carries its marker, so it replays the new side (versions %v)", id, f, versions[id]))
			}
		}
	}
	for id := range listed {
		if !slices.Contains(ids, id) {
			problems = append(problems, fmt.Sprintf("oldSides lists %q, which no GetVersion in workflows/ uses any more", id))
		}
	}
	slices.Sort(problems)
	return problems
}

// replayVersions replays a recorded history (a path under tests/histories;
// those under encrypted/ through the test codec) and returns the versions
// each GetVersion call got, by change id.
func replayVersions(root, rel string) (map[string][]workflow.Version, error) {
	spy := &versionSpy{got: map[string][]workflow.Version{}}
	opts := worker.WorkflowReplayerOptions{Interceptors: []interceptor.WorkerInterceptor{spy}}
	if strings.HasPrefix(rel, "encrypted/") {
		ring, err := codec.NewKeyring(testenv.CodecTestKeyID, codec.Key{ID: testenv.CodecTestKeyID, Secret: testenv.CodecTestKeySecret})
		if err != nil {
			return nil, err
		}
		ring.ApplyReplayer(&opts)
	}
	r, err := worker.NewWorkflowReplayerWithOptions(opts)
	if err != nil {
		return nil, err
	}
	register(r)
	if err := r.ReplayWorkflowHistoryFromJSONFile(nil, filepath.Join(root, "tests", "histories", rel)); err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	return spy.versions(), nil
}

// versionSpy records what every GetVersion call of a replay returned.
type versionSpy struct {
	interceptor.WorkerInterceptorBase
	mu  sync.Mutex
	got map[string][]workflow.Version
}

func (s *versionSpy) record(id string, v workflow.Version) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got[id] = append(s.got[id], v)
}

func (s *versionSpy) versions() map[string][]workflow.Version {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got
}

func (s *versionSpy) InterceptWorkflow(_ workflow.Context, next interceptor.WorkflowInboundInterceptor) interceptor.WorkflowInboundInterceptor {
	in := &versionInbound{spy: s}
	in.Next = next
	return in
}

type versionInbound struct {
	interceptor.WorkflowInboundInterceptorBase
	spy *versionSpy
}

func (i *versionInbound) Init(outbound interceptor.WorkflowOutboundInterceptor) error {
	out := &versionOutbound{spy: i.spy}
	out.Next = outbound
	return i.Next.Init(out)
}

type versionOutbound struct {
	interceptor.WorkflowOutboundInterceptorBase
	spy *versionSpy
}

func (o *versionOutbound) GetVersion(ctx workflow.Context, changeID string, minSupported, maxSupported workflow.Version) workflow.Version {
	v := o.Next.GetVersion(ctx, changeID, minSupported, maxSupported)
	o.spy.record(changeID, v)
	return v
}

func (o *versionOutbound) GetVersionWithOptions(ctx workflow.Context, changeID string, minSupported, maxSupported workflow.Version, options workflow.GetVersionOptions) workflow.Version {
	v := o.Next.GetVersionWithOptions(ctx, changeID, minSupported, maxSupported, options)
	o.spy.record(changeID, v)
	return v
}

// The recorded fallback (tests/integration's
// TestFallbackAnswersFromTheLongPool: the short pool's model refused the
// prompt as too long, the long pool answered) replays through the new
// side of pool-fallbacks: its path stays covered as the code changes.
func TestFallbackHistoryReplaysTheNewSide(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	versions, err := replayVersions(root, "chat_fallback.json")
	if err != nil {
		t.Fatal(err)
	}
	if got := versions["pool-fallbacks"]; !slices.Equal(got, []workflow.Version{1}) {
		t.Fatalf("pool-fallbacks versions %v, want [1]", got)
	}
}
