package retrieval

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
)

// Document is one source text of a kb.
type Document struct {
	// ID is stable across loads, e.g. the file's path without extension.
	ID    string
	Title string
	Text  string
}

// ParseDocument builds a Document from a file's content: a first line
// "# Title" becomes the title, otherwise the title is made from the id.
func ParseDocument(id, content string) Document {
	body := strings.TrimLeft(strings.ReplaceAll(content, "\r\n", "\n"), "\n \t")
	first, rest, _ := strings.Cut(body, "\n")
	if title, ok := strings.CutPrefix(strings.TrimSpace(first), "# "); ok {
		return Document{ID: id, Title: strings.TrimSpace(title), Text: strings.TrimSpace(rest)}
	}
	title := strings.NewReplacer("-", " ", "_", " ").Replace(path.Base(id))
	return Document{ID: id, Title: title, Text: strings.TrimSpace(body)}
}

// LoadDir reads every *.md and *.txt file under dir, recursively.
func LoadDir(dir string) ([]Document, error) {
	docs, err := LoadFS(os.DirFS(dir), ".")
	if err != nil {
		return nil, fmt.Errorf("load documents from %s: %w", dir, err)
	}
	return docs, nil
}

// LoadFS reads every *.md and *.txt file under root in fsys, sorted by
// path. A document's ID is its path below root without the extension.
func LoadFS(fsys fs.FS, root string) ([]Document, error) {
	var docs []Document
	err := fs.WalkDir(fsys, root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		ext := path.Ext(p)
		if d.IsDir() || (ext != ".md" && ext != ".txt") {
			return nil
		}
		raw, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p, root), "/")
		if root == "." {
			rel = p
		}
		docs = append(docs, ParseDocument(strings.TrimSuffix(rel, ext), string(raw)))
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("no .md or .txt files under %s", root)
	}
	sort.Slice(docs, func(i, j int) bool { return docs[i].ID < docs[j].ID })
	return docs, nil
}
