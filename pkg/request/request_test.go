package request

import "testing"

func TestRoute(t *testing.T) {
	for _, tc := range []struct {
		bound, history, threshold int
		want                      string
	}{
		{100, 0, 100, PoolShort},
		{101, 0, 100, PoolLong},
		{60, 40, 100, PoolShort},
		// The session's turns can move a prompt that fits on its own to
		// the long pool.
		{60, 41, 100, PoolLong},
		{0, 0, 0, PoolShort},
	} {
		if got := Route(tc.bound, tc.history, tc.threshold); got != tc.want {
			t.Errorf("Route(%d, %d, %d) = %q, want %q", tc.bound, tc.history, tc.threshold, got, tc.want)
		}
	}
}

func TestPools(t *testing.T) {
	for _, p := range Pools() {
		if !IsPool(p) {
			t.Errorf("IsPool(%q) = false", p)
		}
	}
	if IsPool(RouteCache) || IsPool("") {
		t.Error("the cache route and the empty name are not pools")
	}
}

func TestClasses(t *testing.T) {
	for i, c := range Classes() {
		if rank, ok := ClassRank(c); !ok || rank != i || !IsClass(c) || !IsServiceTier(c) {
			t.Errorf("class %q: rank %d %v", c, rank, ok)
		}
	}
	if IsClass(ClassAuto) || !IsServiceTier(ClassAuto) || !IsServiceTier("") {
		t.Error("auto and none are service_tier values, not classes")
	}
	for _, v := range []string{"scale", "Priority", " default"} {
		if IsServiceTier(v) {
			t.Errorf("IsServiceTier(%q)", v)
		}
	}
}
