package docs

import (
	"cmp"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
)

// The convention (docs/testing.md, "Quoting a bench"): a paragraph, list
// item or table row that links a report under tests/load/report/ quotes
// that report, so every number in it must appear in one of the reports it
// links. A table takes the reports linked by its caption, the paragraph
// right before it when that paragraph ends with a colon. The numbers of
// one unit are checked together: a unit that quotes a report says nothing
// else with numbers in it.

// reportDir is where the benches write their reports, from the root.
const reportDir = "tests/load/report"

// unit is a paragraph, a list item or a table row of a markdown file: the
// span whose numbers are checked against the reports it links.
type unit struct {
	line    int      // 1-based, its first line
	text    string   // its lines, inline code and links as written
	row     bool     // a table row
	caption []string // a row's table's caption's report links
	table   string   // a row's table's header row and the unit before it
}

var (
	listItem = regexp.MustCompile(`^\s*([-*+]|\d+\.)\s`)
	tableSep = regexp.MustCompile(`^\|[\s:|-]*$`)
)

// units splits a markdown text into the spans the convention checks.
// Fenced code and headings are not units: a heading names, a code block
// shows commands and output.
func units(text, dir string) []unit {
	var out []unit
	var cur *unit
	var caption []string
	var table string
	// before is the paragraph or item a table may start after, with only
	// blank lines between: its caption.
	var before *unit
	inTable, fenced := false, false
	end := func() {
		if cur != nil {
			out = append(out, *cur)
			before, cur = cur, nil
		}
	}
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			fenced = !fenced
			end()
			before = nil
			continue
		}
		isRow := strings.HasPrefix(trimmed, "|")
		if !isRow {
			inTable = false
		}
		switch {
		case fenced || strings.HasPrefix(trimmed, "#"):
			end()
			before = nil
		case trimmed == "":
			end()
		case isRow:
			if !inTable {
				end()
				caption, table = nil, line
				if before != nil {
					table = before.text + "\n" + line
					if strings.HasSuffix(strings.TrimSpace(before.text), ":") {
						caption = reportLinks(before.text, dir)
					}
				}
			}
			before, inTable = nil, true
			if !tableSep.MatchString(trimmed) {
				out = append(out, unit{line: i + 1, text: line, row: true, caption: caption, table: table})
			}
		case listItem.MatchString(line) || cur == nil:
			end()
			cur = &unit{line: i + 1, text: line}
		default:
			cur.text += "\n" + line
		}
	}
	end()
	return out
}

var (
	// mdLink is [text](target) or ![alt](target); group 1 the text, 2
	// the target.
	mdLink  = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)\)`)
	bareURL = regexp.MustCompile(`https?://[^\s)>]+`)
)

// reportLinks are the reports a unit's text links (outside code), as
// paths from the root; dir is the markdown file's folder from the root.
func reportLinks(text, dir string) []string {
	var out []string
	for _, m := range mdLink.FindAllStringSubmatch(noCode(text), -1) {
		target, _, _ := strings.Cut(m[2], "#")
		if target == "" || external.MatchString(target) {
			continue
		}
		p := path.Join(dir, target)
		if path.Dir(p) == reportDir && strings.HasSuffix(p, ".md") && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// noCode is a unit's text with its inline code blanked. A unit holds no
// fenced code, and a code span may run over a line break, so the whole
// unit is matched at once (withoutCode goes line by line).
func noCode(text string) string {
	return inlineCode.ReplaceAllString(text, "``")
}

// prose is a unit's text as read: inline code blanked (commands and flags
// are not figures), links reduced to their text, URLs dropped.
func prose(text string) string {
	text = noCode(text)
	text = mdLink.ReplaceAllString(text, "$1")
	text = bareURL.ReplaceAllString(text, "")
	return listItem.ReplaceAllString(text, " ")
}

var (
	isoDate = regexp.MustCompile(`\b\d{4}-\d{2}-\d{2}\b`)
	// number is a figure not glued to a word on its left (P99, L2, v0.1.0
	// and commit ids are not figures); group 1 the digits with their
	// separators, group 2 what is glued to its right.
	number = regexp.MustCompile(`(?:^|[^\p{L}\p{N}_.])(\d(?:[\d,.]*\d)?)([\p{L}×%]*)`)
	// thousands is a number written with thousands separators.
	thousands = regexp.MustCompile(`^\d{1,3}(,\d{3})+(\.\d+)?$`)
	// duration splits Go's durations (1m30s), which reports print, into
	// their parts.
	duration = regexp.MustCompile(`(\d)([hm])(\d)`)
)

// figureUnits are what a figure may carry glued to it; a number glued to
// any other word (5xx, 3rd, 16e4d0d) is not a figure, in a doc or a
// report.
var figureUnits = map[string]bool{
	"": true, "s": true, "ms": true, "µs": true, "us": true, "ns": true,
	"m": true, "min": true, "h": true, "x": true, "×": true, "%": true,
	"B": true, "KiB": true, "MiB": true, "GiB": true, "KB": true, "MB": true, "GB": true,
}

// figures are the normalised numbers of a text, a doc's or a report's:
// a number glued to a word that is not a unit is left out, and Go's
// durations (1m30s) count as their parts.
func figures(text string) []string {
	text = isoDate.ReplaceAllString(text, " ")
	for duration.MatchString(text) {
		text = duration.ReplaceAllString(text, "$1$2 $3")
	}
	var out []string
	for _, m := range number.FindAllStringSubmatch(text, -1) {
		if !figureUnits[m[2]] {
			continue
		}
		out = append(out, normalise(m[1])...)
	}
	return out
}

// normalise writes a number one way: no thousands separators, no trailing
// zeros (24.750 and 24.75, 1.00 and 1, 1,000 and 1000 are one figure). A
// comma that is not a thousands separator lists numbers (0.5,1,2); a
// second dot makes a version, not a number.
func normalise(n string) []string {
	if thousands.MatchString(n) {
		n = strings.ReplaceAll(n, ",", "")
	}
	var out []string
	for _, part := range strings.Split(n, ",") {
		if part == "" || strings.Count(part, ".") > 1 {
			continue
		}
		if strings.Contains(part, ".") {
			part = strings.TrimRight(strings.TrimRight(part, "0"), ".")
		}
		out = append(out, part)
	}
	return out
}

// reports gives what the quote check needs of a report, by its path
// from the root: its text, and why it is stale ("" while it is fresh).
type reports struct {
	read  func(string) (string, error)
	stale func(string) string
}

// staleMark is the word a unit quoting a stale report must carry, so a
// reader knows its figures may no longer describe the code.
var staleMark = regexp.MustCompile(`(?i)\bstale\b`)

// checkQuotes returns what a document quotes wrongly: name is the file
// from the root (its folder resolves links).
func checkQuotes(name, text string, src reports) []string {
	var problems []string
	dir := path.Dir(name)
	for _, u := range units(text, dir) {
		links := reportLinks(u.text, dir)
		if u.row {
			links = append(links, u.caption...)
		}
		if len(links) == 0 {
			continue
		}
		var figs, dates, texts []string
		var unread error
		for _, l := range links {
			report, err := src.read(l)
			unread = cmp.Or(unread, err)
			texts = append(texts, report)
			figs = append(figs, figures(report)...)
			dates = append(dates, isoDate.FindAllString(report, -1)...)
		}
		if unread != nil {
			problems = append(problems, fmt.Sprintf("%s:%d: %v", name, u.line, unread))
			continue
		}
		p := prose(u.text)
		for _, l := range links {
			if why := src.stale(l); why != "" && !staleMark.MatchString(p) {
				problems = append(problems, fmt.Sprintf("%s:%d: quotes %s, which is stale (%s): re-run its bench, or say \"stale\" where it is quoted", name, u.line, l, why))
			}
		}
		problems = append(problems, checkVerdicts(fmt.Sprintf("%s:%d", name, u.line), p, u.row, texts, links)...)
		for _, f := range figures(p) {
			if !slices.Contains(figs, f) {
				problems = append(problems, fmt.Sprintf("%s:%d: %s is not in %s", name, u.line, f, strings.Join(links, " or ")))
			}
		}
		for _, d := range isoDate.FindAllString(p, -1) {
			if !slices.Contains(dates, d) {
				problems = append(problems, fmt.Sprintf("%s:%d: the date %s is not in %s (a figure of another run?)", name, u.line, d, strings.Join(links, " or ")))
			}
		}
	}
	return problems
}

var (
	// benchNamed is a bench named the ways the docs name one.
	benchNamed = regexp.MustCompile(`(?:make\s+bench-|sluice-bench\s+)([a-z]+)`)
	// benchFigure is a figure in a unit a bench measures in: time, a
	// rate, a ratio, a share or memory.
	benchFigure = regexp.MustCompile(`\d(?:[\d,.]*\d)?\s?(?:ms\b|µs|×|x\b|%|KiB|MiB|GiB|MB\b|/s\b|[a-z]+/s\b)`)
)

// checkUnlinked returns the units of a document that name a bench which
// writes a report (benches: bench name → report) and quote a figure with
// a bench's unit, without linking any report: a figure with nothing to
// check it against.
func checkUnlinked(name, text string, benches map[string]string) []string {
	var problems []string
	dir := path.Dir(name)
	for _, u := range units(text, dir) {
		if len(reportLinks(u.text, dir)) > 0 || len(u.caption) > 0 {
			continue
		}
		for _, m := range benchNamed.FindAllStringSubmatch(u.text, -1) {
			report, ok := benches[m[1]]
			if !ok {
				continue
			}
			if fig := benchFigure.FindString(prose(u.text)); fig != "" {
				problems = append(problems, fmt.Sprintf("%s:%d: quotes %q beside %q without linking a report (%s)", name, u.line, fig, m[0], report))
				break
			}
		}
	}
	return problems
}
