// Package listflag reads the comma-separated list flags of moonraft,
// moonctl and moonbench (--peers, --endpoints, --clients...).
package listflag

import "strings"

// Split returns the items of a comma-separated list, trimmed, without
// empty ones: "a, b,,c" is [a b c], "" is none.
func Split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
