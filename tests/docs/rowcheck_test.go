package docs

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// A verdict is only true of the row that judged it: "1.33× (goal ≤ 1.25×,
// missed)" quotes one line of a report, and each of its three parts must
// come from that line. Checking the parts one by one against the whole
// report lets "1.25× (goal ≤ 1.33×, met)" through, since both numbers and
// the word "met" are somewhere in it.

// judged is a report line that a bench judged: it ends "(goal …) — met"
// or "— MISSED".
type judged struct {
	line string
	figs []string // every figure of the line
	goal []string // the figures of its goal
	met  bool
}

var (
	// reportVerdict is where a report line states its verdict.
	reportVerdict = regexp.MustCompile(`\)\s*—\s*(met|MISSED)\b`)
	// docVerdict is a verdict in a doc's prose.
	docVerdict = regexp.MustCompile(`(?i)\b(met|missed)\b`)
	// goalFigure is a figure a doc or a report states as a goal: after
	// "goal" or a bound.
	goalFigure = regexp.MustCompile(`(?:\bgoal\b\s*(?:[≤≥<>]=?)?|[≤≥]|[<>]=)\s*(?:[a-z' ]*?\s)?(\d(?:[\d,.]*\d)?)`)
	// clauseEnd ends a claim in prose: a sentence's end or a semicolon.
	clauseEnd = regexp.MustCompile(`[.;]\s|;$`)
)

// judgedRows are the judged lines of a report's text.
func judgedRows(report string) []judged {
	var out []judged
	for _, line := range strings.Split(report, "\n") {
		loc := reportVerdict.FindStringSubmatchIndex(line)
		if loc == nil {
			continue
		}
		j := judged{line: line, figs: figures(line), met: line[loc[2]:loc[3]] == "met"}
		if g := strings.LastIndex(line[:loc[0]], "(goal "); g >= 0 {
			j.goal = figures(line[g:loc[0]])
		}
		out = append(out, j)
	}
	return out
}

// claim is a verdict a doc states: the figure it judges, the goal's
// figures, met or missed. A verdict in a table of goals may take its
// goals from the row's first cell (label).
type claim struct {
	text  string
	value string // "" when no figure precedes the verdict
	goal  []string
	label []string
	met   bool
}

// claims are the verdicts of a unit's prose; a table row's cells are
// read one by one, each with the goals of the row's first cell.
func claims(p string, row bool) []claim {
	if !row {
		return clauseClaims(p, nil)
	}
	cells := strings.Split(strings.Trim(strings.TrimSpace(p), "|"), "|")
	label := goalsOf(cells[0])
	out := clauseClaims(cells[0], nil)
	for _, c := range cells[1:] {
		out = append(out, clauseClaims(c, label)...)
	}
	return out
}

// goalsOf are the figures a text states as goals.
func goalsOf(text string) []string {
	var out []string
	for _, m := range goalFigure.FindAllStringSubmatch(text, -1) {
		out = append(out, normalise(m[1])...)
	}
	return out
}

// clauseClaims are the verdicts of a stretch of prose: each judges the
// last figure before its goal (or before the verdict, without one), in
// its clause.
func clauseClaims(p string, label []string) []claim {
	p = strings.ReplaceAll(p, "*", "")
	var out []claim
	start := 0
	for _, v := range docVerdict.FindAllStringSubmatchIndex(p, -1) {
		from := start
		for _, e := range clauseEnd.FindAllStringIndex(p[start:v[0]], -1) {
			from = start + e[1]
		}
		text, before := p[from:v[0]], p[from:v[0]]
		c := claim{text: strings.Join(strings.Fields(p[from:v[1]]), " "), label: label, met: strings.EqualFold(p[v[2]:v[3]], "met")}
		if g := goalFigure.FindStringIndex(text); g != nil {
			before = text[:g[0]]
			c.goal = goalsOf(text[g[0]:])
		}
		if figs := figures(before); len(figs) > 0 {
			c.value = figs[len(figs)-1]
		}
		start = v[1]
		if c.value == "" && len(c.goal) == 0 && len(c.label) == 0 {
			continue // "met" or "missed" in a sentence, judging no figure
		}
		out = append(out, c)
	}
	return out
}

// holds says whether the judged rows state a claim. A figure with its
// own goal is one row's; a figure under a row of goals is a row's with
// one of them; a bare verdict on a row of goals says all of them were
// met, or one of them missed.
func (c claim) holds(rows []judged) bool {
	one := func(value string, goals []string, all bool) bool {
		return slices.ContainsFunc(rows, func(j judged) bool {
			if c.met != j.met || (value != "" && !slices.Contains(j.figs, value)) {
				return false
			}
			in := func(g string) bool { return slices.Contains(j.goal, g) }
			if all {
				return !slices.ContainsFunc(goals, func(g string) bool { return !in(g) })
			}
			return len(goals) == 0 || slices.ContainsFunc(goals, in)
		})
	}
	switch {
	case len(c.goal) > 0:
		return one(c.value, c.goal, true)
	case c.value != "":
		return one(c.value, c.label, false)
	case c.met:
		for _, g := range c.label {
			if !one("", []string{g}, true) {
				return false
			}
		}
		return true
	default:
		return one("", c.label, false)
	}
}

// checkVerdicts returns the claims of a unit (its prose p) that no judged
// row of its reports' texts states.
func checkVerdicts(where, p string, row bool, reports []string, links []string) []string {
	var rows []judged
	for _, r := range reports {
		rows = append(rows, judgedRows(r)...)
	}
	var problems []string
	for _, c := range claims(p, row) {
		if !c.holds(rows) {
			verdict := "missed"
			if c.met {
				verdict = "met"
			}
			problems = append(problems, fmt.Sprintf("%s: %q: no line of %s judges %s with goal %s as %s (a figure, its goal and its verdict come from one line of the report)",
				where, c.text, strings.Join(links, " or "), cmp.Or(c.value, "no figure"), cmp.Or(strings.Join(c.goal, ", "), strings.Join(c.label, ", "), "none"), verdict))
		}
	}
	return problems
}
