package integration

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestExpiryRaisesDeleteSelf checks docs/PROTOCOL.md §6a: a lease that the daemon itself
// ends (here: heartbeat expiry, found by the reaper) is removed from the
// kernel's view at once, so a watch on the lease file reports IN_DELETE_SELF
// without anyone touching the name.
func TestExpiryRaisesDeleteSelf(t *testing.T) {
	t.Parallel()
	tool := requireTool(t, "inotifywait")
	d := startDaemon(t, daemonOpts{leaseDuration: 2 * time.Second})
	p := filepath.Join(d.mountpoint, "expiring")
	reserve(t, p)

	stdout, exited := startInotifywait(t, tool, "-e", "delete_self", "--format", "%e", p)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("no IN_DELETE_SELF within 15 s of a 2 s lease; inotifywait said %q", stdout.String())
	}
	if got := strings.TrimSpace(stdout.String()); got != "DELETE_SELF" {
		t.Errorf("inotifywait reported %q, want DELETE_SELF", got)
	}
	if names := listMount(t, d.mountpoint); len(names) != 0 {
		t.Errorf("mount lists %v after expiry, want nothing", names)
	}
}

// startInotifywait runs inotifywait with args and returns once its watches
// are established: its stdout, and a channel closed when it exits. Cleanup
// kills it.
func startInotifywait(t *testing.T, tool string, args ...string) (*logBuffer, <-chan struct{}) {
	t.Helper()
	stdout := newLogBuffer(nil)
	stderr := newLogBuffer(regexp.MustCompile(`Watches established`))
	w := exec.Command(tool, args...)
	w.Stdout, w.Stderr = stdout, stderr
	if err := w.Start(); err != nil {
		t.Fatalf("start inotifywait: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = w.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = w.Process.Kill()
		<-exited
	})
	select {
	case <-stderr.ready:
	case <-exited:
		t.Fatalf("inotifywait exited before watching: %s%s", stdout.String(), stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatalf("inotifywait not watching after 10s: %s", stderr.String())
	}
	return stdout, exited
}
