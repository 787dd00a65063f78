// Package integration holds the black-box tests of leasefs: TestMain builds the binary once,
// each test mounts it in its own temporary directory and drives it with real client processes
// (bash, python3, flock(1), setpriv, inotifywait), and every mount is detached in t.Cleanup.
//
// The tests need /dev/fuse and root. Without them they skip, unless LEASEFS_REQUIRE_FUSE=1 is
// set (as in CI), in which case they fail.
//
// Run them with `go test ./integration/`; each test that mounts runs in parallel with its own
// daemon, mountpoint and state directory.
package integration
