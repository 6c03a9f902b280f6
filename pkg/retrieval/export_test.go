package retrieval

// PatchAlways makes l patch its indexes whatever the size of a change,
// RebuildAlways makes it rebuild them; call either before l is used.
func PatchAlways(l *Live)   { l.rebuild = func(*index, int, int) bool { return false } }
func RebuildAlways(l *Live) { l.rebuild = func(*index, int, int) bool { return true } }
