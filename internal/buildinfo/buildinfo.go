// Package buildinfo says which build of moonraft is running, for
// ServiceReady and `moonraft --version`.
package buildinfo

import (
	"runtime/debug"
	"sync"
)

// Version is the module version of the main package ("devel" for a build
// from a work tree), with the VCS revision when the build recorded one
// (a "+dirty" suffix for uncommitted changes): e.g. "devel+3f2a1b0c9d1e".
var Version = sync.OnceValue(func() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	return describe(info)
})

func describe(info *debug.BuildInfo) string {
	v := info.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		v += "+" + rev + dirty
	}
	return v
}
