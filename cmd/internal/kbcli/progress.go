package kbcli

import (
	"fmt"
	"io"
	"strings"
)

// tally is where a run stands: files decided out of total, and how.
type tally struct {
	total     int
	done      int // sent, skipped or refused locally
	kept      int // skipped: the kb holds this content already
	changed   int // sent, and the kb changed
	unchanged int // sent, and the kb had the same content
	problems  int // could not be documents
	batches   int
	bytes     int64 // of documents sent
	version   int64 // the kb's version after the last batch
}

// progress shows a run's tally on w: a bar redrawn in place on a
// terminal, a line per batch elsewhere (a log, a CI job), or nothing.
type progress struct {
	w    io.Writer
	mode string // "bar", "lines" or "none"
	kb   string
	// drawn is whether the bar is on screen, to be cleared before a note.
	drawn bool
}

func newProgress(w io.Writer, mode, kb string) *progress {
	if mode == "" {
		mode = "lines"
		if isTerminal(w) {
			mode = "bar"
		}
	}
	return &progress{w: w, mode: mode, kb: kb}
}

// batch shows the tally after a batch was sent.
func (p *progress) batch(t tally, files int) {
	switch p.mode {
	case "bar":
		p.draw(t)
	case "lines":
		fmt.Fprintf(p.w, "batch %d: %d files sent, %d/%d files done (%d changed, %d unchanged, %d already in kb %s)\n",
			t.batches, files, t.done, t.total, t.changed, t.unchanged, t.kept, p.kb)
	}
}

// update redraws the bar; lines show only batches.
func (p *progress) update(t tally) {
	if p.mode == "bar" {
		p.draw(t)
	}
}

// note shows a line that stays (a file skipped, a retry) above the bar.
func (p *progress) note(format string, args ...any) {
	if p.mode == "none" {
		return
	}
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
	fmt.Fprintf(p.w, format+"\n", args...)
}

// finish ends the bar's line.
func (p *progress) finish() {
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

const barWidth = 30

func (p *progress) draw(t tally) {
	fmt.Fprint(p.w, "\r\033[K"+barLine(t))
	p.drawn = true
}

// barLine is the bar's text: how many files are done out of how many, as
// a bar and as numbers, and what was sent.
func barLine(t tally) string {
	filled := barWidth
	if t.total > 0 {
		filled = barWidth * t.done / t.total
	}
	return fmt.Sprintf("[%s%s] %d/%d files  %s sent", strings.Repeat("#", filled), strings.Repeat(".", barWidth-filled),
		t.done, t.total, byteSize(t.bytes))
}

// byteSize is n in B, KiB or MiB.
func byteSize(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
