package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// goName is a backticked span that names Go code: identifiers joined by
// dots (request.Route, events.Log.AppendFinal, postChat). Spans without an
// upper-case letter are left alone: they are words, config keys
// (admission.max_wait) or event names (done) as often as code.
var goName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(\(\))?$`)

// pathName is a backticked span that names a file or folder of the tree.
var pathName = regexp.MustCompile(`^[a-z][a-z0-9_./-]*(/|\.go|\.lua|\.sh)$|^(api|app|cmd|door|follow|pkg|workflows|activities|worker|deploy|tests|docs)(/[A-Za-z0-9_.-]+)*/?$`)

// backticked are the backticked spans of a Markdown text, outside fenced
// code blocks.
func backticked(text string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		parts := strings.Split(line, "`")
		for i := 1; i < len(parts); i += 2 {
			out = append(out, parts[i])
		}
	}
	return out
}

// codeIndex is what the module's Go code declares, as a doc may name it:
// each package's top-level names (by the package's name, which several
// packages may share), each type's methods and fields (by the type's
// name), every name anywhere, and every file name.
type codeIndex struct {
	packages map[string]map[string]bool
	members  map[string]map[string]bool
	names    map[string]bool
	files    map[string]bool
}

func (ix *codeIndex) add(m map[string]map[string]bool, key, name string) {
	if m[key] == nil {
		m[key] = map[string]bool{}
	}
	m[key][name] = true
	ix.names[name] = true
}

// declared indexes the module's non-test Go code under root.
func declared(t *testing.T, root string) *codeIndex {
	t.Helper()
	ix := &codeIndex{packages: map[string]map[string]bool{}, members: map[string]map[string]bool{},
		names: map[string]bool{}, files: map[string]bool{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "bin" || n == "testdata" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		ix.files[d.Name()] = true
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ix.index(f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ix
}

// index adds one file's declarations.
func (ix *codeIndex) index(f *ast.File) {
	pkg := f.Name.Name
	ix.names[pkg] = true
	if ix.packages[pkg] == nil {
		ix.packages[pkg] = map[string]bool{}
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				ix.add(ix.packages, pkg, d.Name.Name)
				continue
			}
			ix.add(ix.members, receiverType(d.Recv.List[0].Type), d.Name.Name)
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					ix.add(ix.packages, pkg, s.Name.Name)
					ix.indexType(s)
				case *ast.ValueSpec:
					for _, id := range s.Names {
						ix.add(ix.packages, pkg, id.Name)
					}
				}
			}
		}
	}
	// Names declared inside functions (local types, their fields) are
	// still names a doc may mention in passing.
	ast.Inspect(f, func(n ast.Node) bool {
		if id, ok := n.(*ast.Field); ok {
			for _, name := range id.Names {
				ix.names[name.Name] = true
			}
		}
		return true
	})
}

// indexType adds a type's fields (and an interface's methods) as its
// members; an embedded field is a member by its type's name.
func (ix *codeIndex) indexType(s *ast.TypeSpec) {
	var fields *ast.FieldList
	switch t := s.Type.(type) {
	case *ast.StructType:
		fields = t.Fields
	case *ast.InterfaceType:
		fields = t.Methods
	default:
		if ix.members[s.Name.Name] == nil {
			ix.members[s.Name.Name] = map[string]bool{}
		}
		return
	}
	for _, field := range fields.List {
		if len(field.Names) == 0 {
			ix.add(ix.members, s.Name.Name, receiverType(field.Type))
		}
		for _, name := range field.Names {
			ix.add(ix.members, s.Name.Name, name.Name)
		}
	}
}

// receiverType is the name of a receiver's (or embedded field's) type.
func receiverType(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return receiverType(t.X)
	case *ast.IndexExpr:
		return receiverType(t.X)
	case *ast.IndexListExpr:
		return receiverType(t.X)
	case *ast.SelectorExpr:
		return t.Sel.Name
	case *ast.Ident:
		return t.Name
	}
	return ""
}

// check says what is wrong with a dotted name a doc gives, "" if nothing:
// pkg.Name must be declared at the top level of a package of that name,
// Type.Member must be a method or field of a type of that name,
// pkg.Type.Member both; a lone name must be declared somewhere.
func (ix *codeIndex) check(word string) string {
	parts := strings.Split(strings.TrimSuffix(word, "()"), ".")
	if len(parts) == 1 {
		if !ix.names[parts[0]] {
			return "nothing in the code declares " + parts[0]
		}
		return ""
	}
	first, rest := parts[0], parts[1:]
	if decls, isPkg := ix.packages[first]; isPkg && strings.ToLower(first[:1]) == first[:1] {
		if !decls[rest[0]] {
			return "package " + first + " declares no " + rest[0]
		}
		first, rest = rest[0], rest[1:]
	}
	for _, member := range rest {
		members, isType := ix.members[first]
		if !isType {
			return first + " is no package or type of the code"
		}
		if !members[member] {
			return "type " + first + " has no method or field " + member
		}
		first = member
	}
	return ""
}

// A doc that walks the code names packages, types, functions and files;
// when one of them is renamed, moved or removed, the doc must follow:
// every path must be where the doc says (a bare file name somewhere in
// the tree), every package-qualified name declared in a package of that
// name, and every Type.Member a member of that type.
func TestArchitectureNamesExist(t *testing.T) {
	const root = "../.."
	ix := declared(t, root)
	for _, doc := range []string{"docs/architecture.md"} {
		raw, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		checked := 0
		for _, span := range backticked(string(raw)) {
			for _, word := range strings.Fields(strings.Trim(span, "()")) {
				word = strings.TrimRight(word, ",;:")
				switch {
				case pathName.MatchString(word):
					checked++
					_, err := os.Stat(filepath.Join(root, word))
					if err != nil && (strings.Contains(strings.TrimSuffix(word, "/"), "/") || !ix.files[word]) {
						t.Errorf("%s names %q: no such file or folder", doc, word)
					}
				case goName.MatchString(word) && strings.ContainsAny(word, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") && !strings.Contains(word, "_"):
					if isAcronym(word) {
						continue
					}
					checked++
					if problem := ix.check(word); problem != "" {
						t.Errorf("%s names %q: %s", doc, word, problem)
					}
				}
			}
		}
		if checked < 50 {
			t.Errorf("%s: only %d names checked; the pattern no longer finds what the doc names", doc, checked)
		}
	}
}

// isAcronym reports a word that is an acronym (SSE, TTL), not a name.
func isAcronym(word string) bool {
	return !strings.Contains(word, ".") && word == strings.ToUpper(word)
}

// The check finds what the old one let through: a name moved to another
// package or type, and a path whose file moved to another folder.
func TestNameCheckCatchesMovedCode(t *testing.T) {
	ix := declared(t, "../..")
	for _, ok := range []string{"door.New", "Door.Admit", "events.Log.AppendFinal", "request.Route", "Follower.Follow", "holdings.Returner.GiveBack"} {
		if problem := ix.check(ok); problem != "" {
			t.Errorf("%s: %s", ok, problem)
		}
	}
	for _, moved := range []string{"door.Follow", "Door.Follow", "Door.Run", "door.Sink", "events.Log.Admit", "NoSuchName"} {
		if ix.check(moved) == "" {
			t.Errorf("%s passes the check though the code has no such thing", moved)
		}
	}
}
