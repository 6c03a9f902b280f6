package embed

import "testing"

func TestLRUEvictsLeastRecentlyUsed(t *testing.T) {
	c := newLRU(2)
	k := func(b byte) [32]byte { return [32]byte{b} }
	c.put(k(1), []float32{1})
	c.put(k(2), []float32{2})
	c.get(k(1)) // 2 is now the least recent
	c.put(k(3), []float32{3})
	if _, ok := c.get(k(2)); ok {
		t.Error("least recently used entry survived")
	}
	for _, b := range []byte{1, 3} {
		if v, ok := c.get(k(b)); !ok || v[0] != float32(b) {
			t.Errorf("entry %d = %v, %v", b, v, ok)
		}
	}
	c.put(k(3), []float32{33})
	if v, _ := c.get(k(3)); v[0] != 33 || c.len() != 2 {
		t.Errorf("update: %v, len %d", v, c.len())
	}
}
