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
var pathName = regexp.MustCompile(`^[a-z][a-z0-9_./-]*(/|\.go|\.lua|\.sh)$|^(api|app|cmd|door|pkg|workflows|activities|worker|deploy|tests|docs)(/[A-Za-z0-9_.-]+)*/?$`)

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

// declared collects every name the module's Go code declares (packages,
// types, functions, methods, fields, constants, variables) and every file
// name in it.
func declared(t *testing.T, root string) (names, files map[string]bool) {
	t.Helper()
	names, files = map[string]bool{}, map[string]bool{}
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
		files[d.Name()] = true
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		names[f.Name.Name] = true
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				names[n.Name.Name] = true
			case *ast.TypeSpec:
				names[n.Name.Name] = true
			case *ast.ValueSpec:
				for _, id := range n.Names {
					names[id.Name] = true
				}
			case *ast.Field:
				for _, id := range n.Names {
					names[id.Name] = true
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names, files
}

// A doc that walks the code names packages, types, functions and files;
// when one of them is renamed or removed, the doc must follow.
func TestArchitectureNamesExist(t *testing.T) {
	const root = "../.."
	names, files := declared(t, root)
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
					if _, err := os.Stat(filepath.Join(root, word)); err != nil && !files[filepath.Base(word)] {
						t.Errorf("%s names %q: no such file or folder", doc, word)
					}
				case goName.MatchString(word) && strings.ContainsAny(word, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") && !strings.Contains(word, "_"):
					for _, part := range strings.Split(strings.TrimSuffix(word, "()"), ".") {
						if part == strings.ToUpper(part) {
							continue // an acronym (SSE, TTL), not a name
						}
						checked++
						if !names[part] {
							t.Errorf("%s names %q: nothing in the code declares %s", doc, word, part)
						}
					}
				}
			}
		}
		if checked < 50 {
			t.Errorf("%s: only %d names checked; the pattern no longer finds what the doc names", doc, checked)
		}
	}
}
