package config

import (
	"fmt"
	"net/netip"
)

// networks checks a list of networks in CIDR form, naming each bad entry
// by its index.
func (v *validator) networks(field string, list []string) {
	for i, s := range list {
		if _, err := netip.ParsePrefix(s); err != nil {
			v.add(fmt.Sprintf("%s[%d]", field, i), "must be a network such as 10.0.0.0/8, got %q", s)
		}
	}
}

// prefixes are list parsed and masked; the configuration is validated,
// so every entry parses.
func prefixes(list []string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}
