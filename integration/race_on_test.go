//go:build race

package integration

// raceEnabled reports whether this test binary was built with -race; the leasefs binary under
// test is then built with -race too, so that the race detector watches the daemon.
const raceEnabled = true
