package retrieval

import (
	"fmt"
	"unsafe"

	"github.com/sluice-dev/sluice/pkg/kbstore"
)

// What a loaded kb holds in memory, in bytes. The index's heap is the sum
// of its documents' docHeapBytes, kept as documents come and go, plus its
// pages, whose size is fixed by the kb's dimensions; a kb's size before it
// is loaded is the sum of its revisions' EstimateBytes, which ingestion
// records in the store. Both come from the same few constants, so what
// ingestion admitted is what a worker accounts (TestMemoryEstimate holds
// them to what the Go heap grows by).
const (
	// slotBytes is what a page holds per chunk slot besides its vector:
	// the Chunk (its string headers and score), its position, length and
	// liveness.
	slotBytes = int64(unsafe.Sizeof(Chunk{})) + 4 + 4 + 1
	// postingBytes is one (slot, tf) posting, 8 bytes, with the spare
	// capacity that growing a postings list by appends leaves (a list
	// ends on average a quarter empty), and a share of the term's map
	// entry: most terms have few postings.
	postingBytes = 16
	// docEntryBytes is a document's entry in the document map: the key's
	// and docSlots' headers and the map's own overhead per entry.
	docEntryBytes = 96
	// indexBytes is an empty index: the shard tables of its two maps and
	// the maps the first edit makes.
	indexBytes = 2 * mapShards * 64
)

// pageBytes is one page of a kb of dims dimensions.
func pageBytes(dims int) int64 {
	return int64(unsafe.Sizeof(page{})) + pageSlots*4*int64(dims)
}

// docHeapBytes is what a document adds to an index besides its slots: its
// chunks' texts and ids, its title (one string its chunks share), its
// entry in the document map and its postings (one per distinct term of
// each chunk).
func docHeapBytes(id, rev, title string, texts []string, postings int) int64 {
	n := docEntryBytes + int64(len(id)+len(rev)+len(title)) + 4*int64(len(texts)) + postingBytes*int64(postings)
	for i, t := range texts {
		n += int64(len(t)) + int64(chunkIDLen(id, i, rev))
	}
	return n
}

// chunkIDLen is len(chunkID(doc, i, rev)) without building it.
func chunkIDLen(doc string, i int, rev string) int {
	n := len(doc) + 2 // '#' and the first digit
	for ; i >= 10; i /= 10 {
		n++
	}
	if rev != "" {
		n += 1 + len(rev)
	}
	return n
}

// memBytes is what the index holds in memory: its documents, its pages
// (full size, since a page is allocated whole) and its maps.
func (ix *index) memBytes() int64 {
	return indexBytes + ix.heap + int64(len(ix.pages))*pageBytes(ix.dims)
}

// MemoryBytes is what kb holds in memory, as the worker accounts it.
func (kb *KB) MemoryBytes() int64 { return kb.ix.memBytes() }

// EstimateBytes is what a revision will take in a worker's memory once
// loaded: its chunk slots and vectors and docHeapBytes. Ingestion records
// it with the revision (kbstore.Revision.Memory), so the store knows what
// a kb needs before a worker loads it. Its vectors must be set.
func EstimateBytes(r kbstore.Revision) int64 {
	var tok Tokenizer
	seen := map[string]struct{}{}
	postings := 0
	for _, c := range r.Chunks {
		clear(seen)
		for _, t := range tok.Terms(indexed(r.Title, c)) {
			if _, ok := seen[string(t)]; !ok {
				seen[string(t)] = struct{}{}
				postings++
			}
		}
	}
	slots := int64(len(r.Chunks)) * (slotBytes + 4*int64(r.Dims))
	return slots + docHeapBytes(r.ID, r.Rev, r.Title, r.Chunks, postings)
}

// TooLargeError is a kb that needs more memory than a worker gives all
// its kbs together (LiveOptions.MemoryBudget): no worker can load it, so
// a query of it is refused rather than retried. It matches
// kbstore.ErrTooLarge, the same refusal made at ingestion. It is returned
// unwrapped so that its message reaches the client as it is.
type TooLargeError struct {
	KB     string
	Bytes  int64
	Budget int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("knowledge base %q would need about %s of memory loaded, more than the %s a worker holds for knowledge bases; delete documents or split it into smaller knowledge bases",
		e.KB, MiB(e.Bytes), MiB(e.Budget))
}

// Is makes errors.Is(err, kbstore.ErrTooLarge) true.
func (e *TooLargeError) Is(target error) bool { return target == kbstore.ErrTooLarge }

// MiB formats a size in mebibytes, as the refusals state it.
func MiB(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
