package integration

import (
	"debug/buildinfo"
	"strings"
	"testing"
)

// TestDaemonBuiltWithRace checks that a -race test run watches the daemon: the leasefs binary
// under test is built with -race exactly when this test binary is.
func TestDaemonBuiltWithRace(t *testing.T) {
	bi, err := buildinfo.ReadFile(leasefsBin)
	if err != nil {
		t.Fatalf("read the build info of %s: %v", leasefsBin, err)
	}
	race := false
	for _, s := range bi.Settings {
		if s.Key == "-race" && s.Value == "true" {
			race = true
		}
	}
	if race != raceEnabled {
		t.Errorf("leasefs built with -race = %v, want %v (the tests' own -race)", race, raceEnabled)
	}
}

// TestRaceReports checks that the harness finds every race detector report in a daemon's log.
func TestRaceReports(t *testing.T) {
	report := func(n string) string {
		return "==================\nWARNING: DATA RACE\nWrite at 0x00c000 by goroutine " + n +
			":\n  main.f()\n==================\n"
	}
	log := "time=1 level=INFO msg=mounted\n" + report("7") + "time=2 level=WARN msg=refused\n" +
		report("9") + "Found 2 data race(s)\n"
	got := raceReports(log)
	if len(got) != 2 || got[0]+"\n" != report("7") || got[1]+"\n" != report("9") {
		t.Errorf("raceReports = %q, want the two reports", got)
	}
	if got := raceReports("time=1 level=INFO msg=mounted\n"); len(got) != 0 {
		t.Errorf("raceReports of a clean log = %q, want none", got)
	}
	if got := raceReports("WARNING: DATA RACE\nRead at"); len(got) != 1 || !strings.HasPrefix(got[0], raceMarker) {
		t.Errorf("raceReports of a truncated report = %q, want it whole", got)
	}
}
