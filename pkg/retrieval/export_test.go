package retrieval

// PatchAlways makes l patch its indexes whatever the size of a change,
// RebuildAlways makes it rebuild them; call either before l is used.
func PatchAlways(l *Live)   { l.rebuild = func(*index, int, int) bool { return false } }
func RebuildAlways(l *Live) { l.rebuild = func(*index, int, int) bool { return true } }

// IndexBytes is what an empty index takes, which a load reserves beside
// its kb's recorded estimate.
const IndexBytes = indexBytes

// TraceMemory makes l call f with its stats, its lock held, whenever a
// load reserves, gives back or settles; call it before l is used.
func TraceMemory(l *Live, f func(MemoryStats)) { l.trace = f }
