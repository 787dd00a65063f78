package cli

import (
	"strings"
	"testing"
	"time"
)

// lock's -w takes a Go duration or, as flock(1)'s -w does, a number of
// seconds.
func TestWaitDurationTakesFlockSeconds(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"30s": 30 * time.Second, "1m30s": 90 * time.Second, "200ms": 200 * time.Millisecond, "0": 0,
		"30": 30 * time.Second, "0.5": 500 * time.Millisecond, "1e-3": time.Millisecond, "-1": -time.Second,
	} {
		var d waitDuration
		if err := d.Set(in); err != nil || time.Duration(d) != want {
			t.Errorf("-w %s = %v, %v; want %v", in, time.Duration(d), err, want)
		}
	}
	for _, in := range []string{"", "abc", "1x", "NaN", "Inf", "1e300", "30 s"} {
		var d waitDuration
		if err := d.Set(in); err == nil {
			t.Errorf("-w %q = %v, want an error", in, time.Duration(d))
		}
	}
}

// lock's help says what a user needs: -w's real default, that "--" is
// optional, and how the mount is found.
func TestLockHelp(t *testing.T) {
	r := runCLI(t, "lock", "--help")
	for _, want := range []string{"(default wait forever)", "NAME [--] CMD", `the one leasefs mount that is up`, "$LEASEFS_MOUNT"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("leasefs lock --help lacks %q:\n%s", want, r.stdout)
		}
	}
}
