package scenario

import (
	"fmt"
	"strconv"
	"strings"
)

// Positives parses a flag's comma-separated list of positive numbers,
// blank entries left out.
func Positives[T int | float64](flagName, what, list string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(list, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		v, err := parse(strings.TrimSpace(f))
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("-%s: bad %s %q", flagName, what, f)
		}
		out = append(out, v)
	}
	return out, nil
}

func ParseFloat(s string) (float64, error) { return strconv.ParseFloat(s, 64) }
