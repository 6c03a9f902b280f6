// Package docs checks that the README describes the tree as it is.
package docs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// layout reads the README's Layout block: its top-level folders, and the
// folders listed under each of them, with the text beside each.
func layout(t *testing.T) (top []string, under map[string]map[string]string) {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Layout\n")
	if !ok {
		t.Fatal("README has no Layout section")
	}
	_, block, _ := strings.Cut(section, "```\n")
	block, _, _ = strings.Cut(block, "```")
	under = map[string]map[string]string{}
	parent := ""
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		name, text, _ := strings.Cut(strings.TrimSpace(line), " ")
		if !strings.HasSuffix(name, "/") {
			t.Fatalf("layout line %q does not start with a folder", line)
		}
		name = strings.TrimSuffix(name, "/")
		if !strings.HasPrefix(line, " ") {
			top, parent = append(top, name), name
			continue
		}
		if under[parent] == nil {
			under[parent] = map[string]string{}
		}
		under[parent][name] = text
	}
	return top, under
}

// dirs lists the folders in dir, without hidden ones and build output.
func dirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && e.Name() != "bin" {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestReadmeLayoutMatchesTheTree(t *testing.T) {
	top, under := layout(t)
	root := "../.."
	if got := dirs(t, root); !slices.Equal(sorted(top), got) {
		t.Errorf("README's top-level folders %v, the tree has %v", sorted(top), got)
	}
	for _, parent := range []string{"pkg"} {
		var listed []string
		for name := range under[parent] {
			listed = append(listed, name)
		}
		if got := dirs(t, filepath.Join(root, parent)); !slices.Equal(sorted(listed), got) {
			t.Errorf("README lists %s/ %v, the tree has %v", parent, sorted(listed), got)
		}
	}
	// A package's Lua lives in its lua/ folder, and the README says so.
	for name, text := range under["pkg"] {
		_, err := os.Stat(filepath.Join(root, "pkg", name, "lua"))
		if says := strings.Contains(text, "Lua in lua/"); says != (err == nil) {
			t.Errorf("pkg/%s: README says Lua in lua/ %v, lua/ exists %v", name, says, err == nil)
		}
	}
	stray, err := filepath.Glob(filepath.Join(root, "pkg", "*", "*.lua"))
	if err != nil || len(stray) > 0 {
		t.Errorf("Lua scripts outside a lua/ folder: %v %v", stray, err)
	}
	for parent, children := range under {
		for name := range children {
			if _, err := os.Stat(filepath.Join(root, parent, name)); err != nil {
				t.Errorf("README lists %s/%s/, which does not exist", parent, name)
			}
		}
	}
}

func sorted(xs []string) []string {
	out := slices.Clone(xs)
	slices.Sort(out)
	return out
}
