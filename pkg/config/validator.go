package config

import (
	"fmt"
	"net/url"
	"strings"
	"time"
)

// validator collects every problem of a configuration, so that one run
// reports them all rather than the first.
type validator struct{ problems []string }

func (v *validator) add(field, format string, args ...any) {
	v.problems = append(v.problems, field+": "+fmt.Sprintf(format, args...))
}

func (v *validator) nonEmpty(field, s string) {
	if strings.TrimSpace(s) == "" {
		v.add(field, "must not be empty")
	}
}

func (v *validator) positive(field string, n int64) {
	if n <= 0 {
		v.add(field, "must be > 0, got %d", n)
	}
}

func (v *validator) duration(field string, d time.Duration) {
	if d <= 0 {
		v.add(field, "must be a positive duration such as 30s, got %s", d)
	}
}

// fraction checks a share of something, such as a rate or a cache's use.
func (v *validator) fraction(field string, x float64) {
	if !(x > 0 && x <= 1) {
		v.add(field, "must be in (0, 1], got %v", x)
	}
}

func (v *validator) httpURL(field, s string) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v.add(field, "must be an http(s) URL, got %q", s)
	}
}

// optionalHTTPURL checks a URL that may be left empty.
func (v *validator) optionalHTTPURL(field, s string) {
	if s != "" {
		v.httpURL(field, s)
	}
}

// uniqueName checks one name in a list whose names must be set and
// distinct, such as API keys or knowledge bases: seen holds the names
// before it and gains this one; duplicate is the problem a repeat reports.
func (v *validator) uniqueName(seen map[string]bool, field, name, duplicate string) {
	if name == "" {
		v.add(field, "must not be empty")
	}
	if seen[name] {
		v.add(field, "%s", duplicate)
	}
	seen[name] = true
}

// unusedEndpoint rejects an endpoint given to a built-in provider, which
// calls no server: the setting would silently do nothing.
func (v *validator) unusedEndpoint(section, remote, builtin, endpoint string) {
	if endpoint != "" {
		v.add(section+".endpoint", "is for %s.provider %s; the %s needs none, got %q", section, remote, builtin, endpoint)
	}
}

func (v *validator) err() error {
	if len(v.problems) == 0 {
		return nil
	}
	return fmt.Errorf("invalid config:\n  %s", strings.Join(v.problems, "\n  "))
}

// hostPort checks a network address such as redis:6379.
func (v *validator) hostPort(field, s string) {
	if !hostPortOK(s) {
		v.add(field, "must be host:port, got %q", s)
	}
}
