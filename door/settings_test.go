package door

import (
	"reflect"
	"testing"

	"github.com/sluice-dev/sluice/pkg/config"
	"github.com/sluice-dev/sluice/pkg/policy"
	"github.com/sluice-dev/sluice/workflows"
)

// A request carries each pool's fallbacks in order, a fallback pool's
// with that pool's model, so that the workflow can say which model it
// moves to; pools without any are absent.
func TestChatCarriesThePoolsFallbacks(t *testing.T) {
	cfg := config.Default()
	if got := ChatSettings(cfg, policy.Tier{}).Fallbacks; got != nil {
		t.Fatalf("fallbacks %+v with none configured", got)
	}
	cfg.Pools.Long.Model = "sim-large"
	cfg.Pools.Short.Fallbacks = []config.Fallback{{Model: "sim-small"}, {Pool: "long"}}
	want := map[string][]workflows.Fallback{"short": {{Model: "sim-small"}, {Pool: "long", Model: "sim-large"}}}
	if got := ChatSettings(cfg, policy.Tier{}).Fallbacks; !reflect.DeepEqual(got, want) {
		t.Fatalf("fallbacks %+v, want %+v", got, want)
	}
}
