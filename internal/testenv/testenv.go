// Package testenv holds what the tests of every leasefs package need of
// their environment: whether they may mount (and must, on CI), and a
// bounded wait for a condition they can observe. Safe for concurrent use.
package testenv

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// FUSERequired reports whether LEASEFS_REQUIRE_FUSE=1 (as CI sets it): a
// test that cannot mount, or lacks a tool it needs, then fails instead of
// skipping (CONTRIBUTING.md, "Running the tests").
func FUSERequired() bool { return os.Getenv("LEASEFS_REQUIRE_FUSE") == "1" }

// SkipOrFail skips t with the message, or fails it when [FUSERequired].
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if FUSERequired() {
		t.Fatalf("LEASEFS_REQUIRE_FUSE=1 but "+format, args...)
	}
	t.Skipf(format, args...)
}

// RequireFUSE skips t (or fails it, see [SkipOrFail]) unless this process
// can mount: /dev/fuse exists and it runs as root.
func RequireFUSE(t testing.TB) {
	t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		SkipOrFail(t, "FUSE unavailable: %v", err)
	}
	if os.Geteuid() != 0 {
		SkipOrFail(t, "mounting needs root (euid %d)", os.Geteuid())
	}
}

// WaitBound is how long [WaitFor] waits: a guard against a hang, never a
// timing assertion.
const WaitBound = 20 * time.Second

// WaitFor polls cond every 5 ms until it holds, and fails t if it does not
// within [WaitBound].
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(WaitBound); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, WaitBound)
		}
	}
}

// StartSleeper starts `sleep 30`, a process a test can kill to see its
// holder die, and kills and reaps it when t ends if the test has not.
func StartSleeper(t testing.TB) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatalf("cannot start sleep: %v", err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd
}

// ExitedPID returns the pid of a child that has exited and been reaped: a
// pid no process has (until the kernel reuses it).
func ExitedPID(t testing.TB) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatalf("cannot run true: %v", err)
	}
	return cmd.Process.Pid
}
