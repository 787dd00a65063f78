package main

import (
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
