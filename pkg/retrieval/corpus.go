package retrieval

import (
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"sort"
)

// corpora holds the built-in knowledge bases, one directory each, so that
// a fresh checkout can answer questions without any data to mount.
//
//go:embed corpus
var corpora embed.FS

// BuiltinNames lists the built-in corpora, e.g. "sluice-docs".
func BuiltinNames() []string {
	entries, _ := fs.ReadDir(corpora, "corpus")
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	return names
}

// Builtin returns the documents of a built-in corpus.
func Builtin(name string) ([]Document, error) {
	if !slices.Contains(BuiltinNames(), name) {
		return nil, fmt.Errorf("load built-in corpus %q: no such corpus (have %v)", name, BuiltinNames())
	}
	docs, err := LoadFS(corpora, "corpus/"+name)
	if err != nil {
		return nil, fmt.Errorf("load built-in corpus %q: %w", name, err)
	}
	return docs, nil
}
