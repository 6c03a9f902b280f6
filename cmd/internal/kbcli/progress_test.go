package kbcli

import (
	"bytes"
	"strings"
	"testing"
)

// On a terminal the bar redraws one line in place and a note clears it
// first; the bar says how far the run is in files and what was sent.
func TestProgressBar(t *testing.T) {
	var w bytes.Buffer
	p := newProgress(&w, "bar", "notes")
	p.update(tally{total: 4, done: 1, bytes: 1536})
	p.note("skip %s: empty", "a.md")
	p.batch(tally{total: 4, done: 4, bytes: 3 << 20, batches: 1}, 3)
	p.finish()
	want := "\r\033[K[#######.......................] 1/4 files  1.5 KiB sent" +
		"\r\033[Kskip a.md: empty\n" +
		"\r\033[K[##############################] 4/4 files  3.0 MiB sent\n"
	if w.String() != want {
		t.Fatalf("bar:\n%q\nwant\n%q", w.String(), want)
	}
	w.Reset()
	if newProgress(&w, "", "notes").mode != "lines" {
		t.Fatal("a buffer is not a terminal: lines expected")
	}
	p = newProgress(&w, "none", "notes")
	p.note("x")
	p.batch(tally{}, 1)
	if w.Len() != 0 {
		t.Fatalf("none printed %q", w.String())
	}
	if s := strings.Count(barLine(tally{total: 0}), "#"); s != barWidth {
		t.Fatalf("an empty run's bar has %d of %d filled", s, barWidth)
	}
}
