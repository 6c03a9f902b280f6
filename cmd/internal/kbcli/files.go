package kbcli

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/sluice-dev/sluice/pkg/ingest"
)

// entry is one file to ingest as one document.
type entry struct {
	file string // where it is on disk
	// source is the path relative to the DIR given (a FILE's name),
	// slash-separated: what progress and errors show, and the document's
	// "source" metadata.
	source string
	id     string
}

// collect lists the files of paths in id order: a DIR's files with one of
// exts, recursively, hidden files and folders left out; a FILE whatever
// its extension. Two files that would make one id are an error, before
// anything is sent.
func collect(paths, exts []string) ([]entry, error) {
	var out []entry
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", p, err)
		}
		if !st.IsDir() {
			// A device, pipe or socket named by mistake (/dev/zero)
			// would be read forever or block: only files are documents.
			if !st.Mode().IsRegular() {
				return nil, fmt.Errorf("read %s: not a regular file or a folder (%s)", p, st.Mode().Type())
			}
			out = append(out, newEntry(p, filepath.Base(p)))
			continue
		}
		err = filepath.WalkDir(p, func(file string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if file != p && strings.HasPrefix(d.Name(), ".") {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if !d.Type().IsRegular() || !slices.Contains(exts, strings.ToLower(filepath.Ext(file))) {
				return nil
			}
			rel, err := filepath.Rel(p, file)
			if err != nil {
				return err
			}
			out = append(out, newEntry(file, filepath.ToSlash(rel)))
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", p, err)
		}
	}
	slices.SortFunc(out, func(a, b entry) int { return strings.Compare(a.id, b.id) })
	for i := 1; i < len(out); i++ {
		if out[i].id == out[i-1].id {
			return nil, fmt.Errorf("%s and %s would both be document %q: rename one, or ingest them into different kbs",
				out[i-1].file, out[i].file, out[i].id)
		}
	}
	return out, nil
}

// newEntry is the file at file, shown as source; its id is source
// without its extension.
func newEntry(file, source string) entry {
	return entry{file: file, source: source, id: strings.TrimSuffix(source, path.Ext(source))}
}

// document reads e's file as the document to send, checked as the API
// checks it, with the hash and size of what is sent. A file that cannot
// be a document is an error naming why.
func (e entry) document() (pending, error) {
	st, err := os.Stat(e.file)
	if err != nil {
		return pending{}, err
	}
	// Refused before it is read: a stray large file costs no memory.
	if st.Size() > ingest.MaxTextBytes {
		return pending{}, fmt.Errorf("%d bytes, over a document's %d", st.Size(), ingest.MaxTextBytes)
	}
	raw, err := readAtMost(e.file, ingest.MaxTextBytes)
	if err != nil {
		return pending{}, err
	}
	doc := ingest.Document{ID: e.id, Text: string(raw), Metadata: map[string]string{"source": e.source}}
	if err := (&ingest.Ingester{}).Validate(doc); err != nil {
		return pending{}, err
	}
	body, err := json.Marshal(doc)
	if err != nil {
		return pending{}, err
	}
	sum := sha256.Sum256(body)
	return pending{doc: doc, sha256: hex.EncodeToString(sum[:]), bytes: len(body)}, nil
}

// readAtMost reads file whole if it holds at most limit bytes. The size
// was checked before, but a file can grow (or be swapped for a device)
// between the check and the read: the read itself stops past limit.
func readAtMost(file string, limit int) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > limit {
		return nil, fmt.Errorf("over a document's %d bytes", limit)
	}
	return raw, nil
}
