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

// TestUnlinkLeavesTheNameToTheKernel checks docs/PROTOCOL.md §6a for an rm
// through the mount: the kernel raises its own IN_DELETE on the directory
// and IN_DELETE_SELF on the file, and the daemon sends no NOTIFY_DELETE for
// a name the kernel has already dropped (it cost every release a write to
// /dev/fuse and a hold of the directory's lock). An end the daemon makes
// itself, a handle lease released with its flock, is raised by the daemon's
// own unlink (TestWatchSeesEveryEnd).
func TestUnlinkLeavesTheNameToTheKernel(t *testing.T) {
	t.Parallel()
	tool := requireTool(t, "inotifywait")
	requireTool(t, "flock")
	d := startDaemon(t, daemonOpts{extraArgs: []string{"--fuse-debug"}})
	p := filepath.Join(d.mountpoint, "unlinked")
	reserve(t, p)
	dirEvents, dirExited := startInotifywait(t, tool, "-e", "delete", "--format", "%e %f", d.mountpoint)
	selfEvents, selfExited := startInotifywait(t, tool, "-e", "delete_self", "--format", "%e", p)
	mustSh(t, `rm "$P"`, "P="+p)
	for _, w := range []struct {
		events *logBuffer
		exited <-chan struct{}
		want   string
	}{{dirEvents, dirExited, "DELETE unlinked"}, {selfEvents, selfExited, "DELETE_SELF"}} {
		select {
		case <-w.exited:
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s within 10 s of rm; inotifywait said %q", w.want, w.events.String())
		}
		if got := strings.TrimSpace(w.events.String()); got != w.want {
			t.Errorf("inotifywait reported %q, want %q", got, w.want)
		}
	}

	// The daemon's feed is handled in order: once the handle lease's end
	// is raised on the directory (the daemon's own unlink of it), a
	// notification for the unlinked name would have been sent too.
	flocked := filepath.Join(d.mountpoint, "flocked")
	all := watchDir(t, d.mountpoint)
	mustSh(t, `flock -n "$P" true`, "P="+flocked)
	waitEvent(t, all, flocked)
	for line := range strings.SplitSeq(d.stderr(), "\n") {
		if strings.Contains(line, "NOTIFY_DELETE, ") && strings.Contains(line, `"unlinked"`) {
			t.Errorf("the daemon notified the kernel of the unlinked name: %s", line)
		}
	}
	if r := sh(t, `set -C; : > "$P"`, "P="+p); r.code != 0 {
		t.Errorf("reserving the unlinked name again: %s", r)
	}
}
