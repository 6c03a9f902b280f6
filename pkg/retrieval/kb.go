package retrieval

import (
	"sync"
)

// KB is a knowledge base at one version: its chunks, their unit-length
// embeddings and a BM25 index (see index). It is immutable and safe for
// concurrent use; Live makes the next version of a kb by patching a copy
// that shares everything unchanged with this one.
type KB struct {
	name    string
	model   string
	version int64
	// epoch is the store's epoch of version (kbstore.Head).
	epoch string
	bm    BM25Options
	ix    *index
	// scratch holds *scoreScratch; the versions of a live kb share it.
	scratch *sync.Pool
}

func newScratch() *sync.Pool {
	return &sync.Pool{New: func() any { return new(scoreScratch) }}
}

// Version returns the store's version of the kb that this one is.
func (kb *KB) Version() int64 { return kb.version }
