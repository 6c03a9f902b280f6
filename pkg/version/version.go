// Package version is the version of this build of Sluice. Release builds
// stamp it from git (make build, make release: -ldflags "-X
// .../pkg/version.Version=... -X .../pkg/version.Commit=..."); a plain go
// build says which release its source is, and the commit only if the go
// command recorded one.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is this build's version: a git tag (v0.1.0), or the release the
// source says with the commit after it (v0.1.0-2951c77).
var Version = "v0.2.0"

// Commit is the git commit this build was made from; empty when nothing
// stamped it (Get then asks the build info).
var Commit = ""

// Info is what a build says of itself: in -version, /healthz and the
// sluice_build_info metric.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"go_version"`
}

// Get is this build's Info. The commit is the stamped one, else the
// revision the go command recorded (go build with VCS stamping), else
// "unknown".
func Get() Info {
	commit := Commit
	if commit == "" {
		commit = recordedRevision()
	}
	if commit == "" {
		commit = "unknown"
	}
	return Info{Version: Version, Commit: commit, GoVersion: runtime.Version()}
}

func recordedRevision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			if len(s.Value) > 12 {
				return s.Value[:12]
			}
			return s.Value
		}
	}
	return ""
}

// String is the one line a binary prints for -version:
// "v0.1.0 (commit 2951c77, go1.26.8)".
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s)", i.Version, i.Commit, i.GoVersion)
}

// Asked reports whether a command line asks for the version: its first
// argument is "version", "-version" or "--version", the same for every
// Sluice binary.
func Asked(args []string) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0] {
	case "version", "-version", "--version":
		return true
	}
	return false
}

// Line is what a binary named name prints when asked its version:
// "sluice-api v0.1.0 (commit 2951c77, go1.26.8)".
func Line(name string) string {
	return name + " " + Get().String()
}
