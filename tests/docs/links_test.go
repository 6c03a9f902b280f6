package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/sluice-dev/sluice/pkg/config"
)

// root is the repository, seen from this package.
const root = "../.."

// maxReadmeLines keeps the README a page a new user reads, not a manual:
// the detail lives in docs/.
const maxReadmeLines = 500

// markdownFiles are the documents whose links and examples are checked:
// the README, the changelog and everything in docs/.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	if _, err := os.Stat(filepath.Join(root, "CHANGELOG.md")); err == nil {
		files = append(files, filepath.Join(root, "CHANGELOG.md"))
	}
	return files
}

// withoutCode is a markdown text with its fenced blocks and inline code
// blanked, line for line, so that what looks like a link inside code is
// not taken for one.
func withoutCode(text string) string {
	lines := strings.Split(text, "\n")
	fenced := false
	for i, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			lines[i] = ""
			continue
		}
		if fenced {
			lines[i] = ""
			continue
		}
		lines[i] = inlineCode.ReplaceAllString(line, "``")
	}
	return strings.Join(lines, "\n")
}

var (
	inlineCode = regexp.MustCompile("`[^`]*`")
	// link matches [text](target) and ![alt](target); the text may hold
	// brackets of its own one level deep.
	link = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)`)
	// external targets are not checked: the tests run offline.
	external = regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`)
)

// links lists the targets of a markdown file's links, outside code.
func links(t *testing.T, file string) []string {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range link.FindAllStringSubmatch(withoutCode(string(raw)), -1) {
		out = append(out, m[1])
	}
	return out
}

// anchors are the ids GitHub gives a markdown file's headings: lower case,
// punctuation dropped, spaces as hyphens, repeats numbered.
func anchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		heading := strings.TrimSpace(strings.TrimLeft(line, "#"))
		id := slug(heading)
		if n := seen[id]; n > 0 {
			seen[id]++
			id = id + "-" + strconv.Itoa(n)
		} else {
			seen[id] = 1
		}
		out[id] = true
	}
	return out
}

func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestRelativeLinksResolve checks that every relative link in the README
// and docs/ names a file or folder that exists, and that every #anchor
// names a heading of the markdown file it points into.
func TestRelativeLinksResolve(t *testing.T) {
	for _, file := range markdownFiles(t) {
		name, _ := filepath.Rel(root, file)
		for _, target := range links(t, file) {
			if external.MatchString(target) {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			resolved := file
			if path != "" {
				resolved = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s: link %q: %s does not exist", name, target, filepath.Clean(resolved))
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(resolved, ".md") {
				continue
			}
			if !anchors(t, resolved)[anchor] {
				t.Errorf("%s: link %q: no heading with the anchor #%s in %s", name, target, anchor, filepath.Base(resolved))
			}
		}
	}
}

func TestReadmeStaysShort(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(raw), "\n"); n >= maxReadmeLines {
		t.Errorf("README.md has %d lines; keep it under %d and move detail into docs/", n, maxReadmeLines)
	}
}

// yamlBlocks are the ```yaml blocks of a markdown file.
func yamlBlocks(t *testing.T, file string) []string {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	rest := string(raw)
	for {
		_, after, ok := strings.Cut(rest, "```yaml\n")
		if !ok {
			return blocks
		}
		block, tail, _ := strings.Cut(after, "```")
		blocks = append(blocks, block)
		rest = tail
	}
}

// TestConfigExamplesLoad checks that every YAML example in the README and
// docs/ is a configuration Sluice starts with: known fields only, values
// that pass validation.
func TestConfigExamplesLoad(t *testing.T) {
	for _, file := range markdownFiles(t) {
		name, _ := filepath.Rel(root, file)
		for i, block := range yamlBlocks(t, file) {
			path := filepath.Join(t.TempDir(), "sluice.yaml")
			if err := os.WriteFile(path, []byte(block), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := config.Load(path, nil); err != nil {
				t.Errorf("%s: YAML example %d does not load: %v\n%s", name, i+1, err, block)
			}
		}
	}
}

func TestSlugIsGitHubs(t *testing.T) {
	for heading, want := range map[string]string{
		"Use it with your model":                      "use-it-with-your-model",
		"Faults (make chaos)":                         "faults-make-chaos",
		"Embeddings: `POST /v1/embeddings`":           "embeddings-post-v1embeddings",
		"Sluice's chat: `POST /v1/chat`":              "sluices-chat-post-v1chat",
		"1. At the door":                              "1-at-the-door",
		"Known limits of the healer — P99/P50, 5 → 2": "known-limits-of-the-healer--p99p50-5--2",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}
