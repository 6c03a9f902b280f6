package retrieval

import (
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/sluice-dev/sluice/pkg/embed"
)

// pageSlots is the number of chunk slots per page. An edit copies each
// page it writes to, so a page is small next to a large kb (at 256
// dimensions a page of vectors is 256 KiB: one changed document copies
// one or two), yet large enough that the page table stays short and a
// scan runs through long stretches of contiguous memory.
const pageSlots = 256

// mapShards is the number of shards of the term and document maps. An
// edit copies each shard it writes to; with 1024 of them a shard of a
// vocabulary of 100k terms holds about a hundred, a copy of a few µs.
const mapShards = 1024

// index is the searchable content of a kb at one version: chunks in
// numbered slots with their unit-length vectors, and an inverted index of
// raw term frequencies. It is immutable once built. The next version is
// made by an edit, which copies only what it writes (the pages of the
// slots it fills or frees, the map shards of the terms and documents it
// changes, the postings lists of those terms) and shares everything else
// with the version it started from, so that patching a large kb costs in
// proportion to the change while queries go on reading the old version.
//
// BM25 weights depend on the number of chunks, their average length and
// each term's document frequency, which every change moves; the postings
// therefore hold term frequencies, and the weights of the query's terms
// are computed when it is scored.
type index struct {
	dims   int
	pages  []*page
	next   int32   // the first slot never used
	free   []int32 // freed slots, for later chunks to reuse
	chunks int     // live chunks
	length int64   // the live chunks' lengths in terms, summed
	ndocs  int
	heap   int64 // the documents' docHeapBytes, summed (see memBytes)
	terms  cowMap[[]posting]
	docs   cowMap[docSlots]
}

type page struct {
	chunks [pageSlots]Chunk
	// seq is the chunk's position in its document: with its DocID, the
	// order in which equal scores are ranked.
	seq    [pageSlots]int32
	length [pageSlots]int32 // terms indexed (title and text)
	live   [pageSlots]bool
	vecs   []float32 // pageSlots vectors of dims values
}

// posting says that a chunk (by slot) holds a term tf times.
type posting struct {
	slot int32
	tf   int32
}

// docSlots is a document as indexed: its revision ("" if it has none)
// and the slots of its chunks, in order.
type docSlots struct {
	rev   string
	slots []int32
	heap  int64 // docHeapBytes
}

func newIndex() *index {
	return &index{terms: newCowMap[[]posting](), docs: newCowMap[docSlots]()}
}

func (ix *index) at(slot int32) (*page, int) {
	return ix.pages[slot/pageSlots], int(slot % pageSlots)
}

// vec returns the vector of a live slot.
func (ix *index) vec(slot int32) []float32 {
	p, j := ix.at(slot)
	return p.vecs[j*ix.dims : (j+1)*ix.dims]
}

// before reports whether slot a ranks before slot b among equal scores:
// by document id, then position in the document. That is the order in
// which a fresh build fills its slots, and it does not depend on where an
// edit happened to put a chunk, so a patched index ranks exactly as a
// fresh one.
func (ix *index) before(a, b int32) bool {
	pa, ja := ix.at(a)
	pb, jb := ix.at(b)
	if c := strings.Compare(pa.chunks[ja].DocID, pb.chunks[jb].DocID); c != 0 {
		return c < 0
	}
	return pa.seq[ja] < pb.seq[jb]
}

// chunkByID returns the live chunk of that id.
func (ix *index) chunkByID(id string) (Chunk, bool) {
	doc, i, rev, ok := parseChunkID(id)
	if !ok {
		return Chunk{}, false
	}
	d, ok := ix.docs.get(doc)
	if !ok || d.rev != rev || i >= len(d.slots) {
		return Chunk{}, false
	}
	p, j := ix.at(d.slots[i])
	return p.chunks[j], true
}

// chunkID names chunk i of a document revision: "<doc>#<i>@<rev>", or
// "<doc>#<i>" without a revision.
func chunkID(doc string, i int, rev string) string {
	if rev == "" {
		return doc + "#" + strconv.Itoa(i)
	}
	return doc + "#" + strconv.Itoa(i) + "@" + rev
}

// parseChunkID undoes chunkID. Document ids hold no '#'; revisions hold
// neither '#' nor '@'.
func parseChunkID(id string) (doc string, i int, rev string, ok bool) {
	hash := strings.LastIndexByte(id, '#')
	if hash < 0 {
		return "", 0, "", false
	}
	num := id[hash+1:]
	if at := strings.IndexByte(num, '@'); at >= 0 {
		num, rev = num[:at], num[at+1:]
		if rev == "" {
			return "", 0, "", false
		}
	}
	i, err := strconv.Atoi(num)
	if err != nil || i < 0 {
		return "", 0, "", false
	}
	return id[:hash], i, rev, true
}

// edit starts the next version of ix, which stays as it is.
func (ix *index) edit() *indexEdit {
	next := *ix
	next.pages = slices.Clone(ix.pages)
	next.free = slices.Clone(ix.free)
	return &indexEdit{
		ix:    &next,
		owned: map[int]bool{},
		terms: ix.terms.edit(),
		docs:  ix.docs.edit(),
		delta: map[string]*termDelta{},
	}
}

// indexEdit builds the next version of an index. Its methods are not
// safe for concurrent use; the version it started from may be searched
// meanwhile.
type indexEdit struct {
	ix    *index
	owned map[int]bool // pages copied (or made) by this edit
	terms cowMapEdit[[]posting]
	docs  cowMapEdit[docSlots]
	freed []uint64 // bitset of the slots this edit freed
	delta map[string]*termDelta
	tok   Tokenizer
}

// termDelta is what an edit does to a term's postings.
type termDelta struct {
	add []posting
	// drop: some of the postings are of freed slots.
	drop bool
}

func (e *indexEdit) termDelta(t []byte) *termDelta {
	d, ok := e.delta[string(t)]
	if !ok {
		d = &termDelta{}
		e.delta[string(t)] = d
	}
	return d
}

// page returns page n for writing.
func (e *indexEdit) page(n int) *page {
	if !e.owned[n] {
		p := *e.ix.pages[n]
		p.vecs = slices.Clone(p.vecs)
		e.ix.pages[n] = &p
		e.owned[n] = true
	}
	return e.ix.pages[n]
}

func (e *indexEdit) alloc() int32 {
	if n := len(e.ix.free); n > 0 {
		s := e.ix.free[n-1]
		e.ix.free = e.ix.free[:n-1]
		return s
	}
	s := e.ix.next
	e.ix.next++
	if int(s/pageSlots) == len(e.ix.pages) {
		e.ix.pages = append(e.ix.pages, &page{vecs: make([]float32, pageSlots*e.ix.dims)})
		e.owned[len(e.ix.pages)-1] = true
	}
	return s
}

// indexed is the text BM25 indexes for a chunk: later chunks of a
// document often no longer name its topic; the title does.
func indexed(title, text string) string { return title + "\n\n" + text }

// remove takes a document out of the index; one that is not in it is no
// error.
func (e *indexEdit) remove(id string) {
	d, ok := e.docs.get(id)
	if !ok {
		return
	}
	for _, s := range d.slots {
		p := e.page(int(s / pageSlots))
		j := int(s % pageSlots)
		for _, t := range e.tok.Terms(indexed(p.chunks[j].Title, p.chunks[j].Text)) {
			e.termDelta(t).drop = true
		}
		e.ix.chunks--
		e.ix.length -= int64(p.length[j])
		p.chunks[j], p.seq[j], p.length[j], p.live[j] = Chunk{}, 0, 0, false
		if w := int(s / 64); w >= len(e.freed) {
			e.freed = append(e.freed, make([]uint64, w+1-len(e.freed))...)
		}
		e.freed[s/64] |= 1 << (s % 64)
		e.ix.free = append(e.ix.free, s)
	}
	e.docs.delete(id)
	e.ix.ndocs--
	e.ix.heap -= d.heap
}

func (e *indexEdit) wasFreed(s int32) bool {
	w := int(s / 64)
	return w < len(e.freed) && e.freed[w]&(1<<(s%64)) != 0
}

// add indexes a document that is not in the index: its chunks' texts and
// their vectors, back to back, already unit length if normalized.
func (e *indexEdit) add(id, rev, title string, texts []string, vecs []float32, normalized bool) error {
	if _, ok := e.docs.get(id); ok {
		return fmt.Errorf("index document %s: already indexed", id)
	}
	if len(texts) == 0 {
		return fmt.Errorf("index document %s: no chunks", id)
	}
	dims := len(vecs) / len(texts)
	if e.ix.dims == 0 && e.ix.next == 0 {
		e.ix.dims = dims
	}
	if dims == 0 || dims != e.ix.dims || len(vecs) != dims*len(texts) {
		return fmt.Errorf("index document %s: %d vector values for %d chunks, the kb has %d dimensions", id, len(vecs), len(texts), e.ix.dims)
	}
	d := docSlots{rev: rev, slots: make([]int32, len(texts))}
	postings := 0
	for i, text := range texts {
		s := e.alloc()
		d.slots[i] = s
		p := e.page(int(s / pageSlots))
		j := int(s % pageSlots)
		p.chunks[j] = Chunk{ID: chunkID(id, i, rev), DocID: id, Title: title, Text: text}
		p.seq[j], p.live[j] = int32(i), true
		v := p.vecs[j*dims : (j+1)*dims]
		copy(v, vecs[i*dims:])
		if !normalized {
			embed.Normalize(v)
		}
		terms := e.tok.Terms(indexed(title, text))
		p.length[j] = int32(len(terms))
		for _, t := range terms {
			td := e.termDelta(t)
			if n := len(td.add); n > 0 && td.add[n-1].slot == s {
				td.add[n-1].tf++ // a repeat within this chunk
			} else {
				td.add = append(td.add, posting{slot: s, tf: 1})
				postings++
			}
		}
		e.ix.chunks++
		e.ix.length += int64(len(terms))
	}
	d.heap = docHeapBytes(id, rev, title, texts, postings)
	e.docs.set(id, d)
	e.ix.ndocs++
	e.ix.heap += d.heap
	return nil
}

// done applies the postings changes and returns the new version.
func (e *indexEdit) done() *index {
	for t, d := range e.delta {
		old, _ := e.terms.get(t)
		var list []posting
		switch {
		case len(old) == 0:
			list = d.add // made by this edit: no copy needed
		case !d.drop:
			list = append(slices.Clip(old), d.add...) // copies old: it is shared
		default:
			list = make([]posting, 0, len(old)+len(d.add))
			for _, p := range old {
				if !e.wasFreed(p.slot) {
					list = append(list, p)
				}
			}
			list = append(list, d.add...)
		}
		if len(list) == 0 {
			// No chunk holds the term any more: gone, as it would be from a
			// fresh build (a query of only such terms is not lexical).
			e.terms.delete(t)
		} else {
			e.terms.set(t, list)
		}
	}
	e.ix.terms, e.ix.docs = e.terms.m, e.docs.m
	ix := e.ix
	*e = indexEdit{}
	return ix
}

// cowMap is a string-keyed map split in shards that versions share: an
// edit copies only the shards it writes.
type cowMap[V any] struct {
	seed   maphash.Seed
	shards []map[string]V
}

func newCowMap[V any]() cowMap[V] {
	return cowMap[V]{seed: maphash.MakeSeed(), shards: make([]map[string]V, mapShards)}
}

func (m cowMap[V]) get(k string) (V, bool) {
	v, ok := m.shards[maphash.String(m.seed, k)%mapShards][k]
	return v, ok
}

// getBytes is get without converting k to a string (which would allocate).
func (m cowMap[V]) getBytes(k []byte) (V, bool) {
	v, ok := m.shards[maphash.Bytes(m.seed, k)%mapShards][string(k)]
	return v, ok
}

func (m cowMap[V]) keys() []string {
	var out []string
	for _, s := range m.shards {
		for k := range s {
			out = append(out, k)
		}
	}
	return out
}

func (m cowMap[V]) edit() cowMapEdit[V] {
	return cowMapEdit[V]{m: cowMap[V]{seed: m.seed, shards: slices.Clone(m.shards)}, owned: make([]bool, mapShards)}
}

type cowMapEdit[V any] struct {
	m     cowMap[V]
	owned []bool
}

func (e *cowMapEdit[V]) get(k string) (V, bool) { return e.m.get(k) }

func (e *cowMapEdit[V]) shard(k string) map[string]V {
	i := maphash.String(e.m.seed, k) % mapShards
	if !e.owned[i] {
		if e.m.shards[i] == nil {
			e.m.shards[i] = map[string]V{}
		} else {
			e.m.shards[i] = maps.Clone(e.m.shards[i])
		}
		e.owned[i] = true
	}
	return e.m.shards[i]
}

func (e *cowMapEdit[V]) set(k string, v V) { e.shard(k)[k] = v }

func (e *cowMapEdit[V]) delete(k string) { delete(e.shard(k), k) }
