// Package version is the version of this build of Sluice. Release builds
// stamp it from git (make build: -ldflags "-X .../pkg/version.Version=...");
// a plain go build says which release its source is.
package version

// Version is this build's version.
var Version = "v0.1.0"
