package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// watchDir runs `inotifywait -m -r -e delete` on dir and returns its
// output buffer (one "DELETE path" line per event) once it watches.
func watchDir(t *testing.T, dir string) *logBuffer {
	t.Helper()
	tool := requireTool(t, "inotifywait")
	out, _ := startInotifywait(t, tool, "-m", "-r", "-e", "delete", "--format", "%e %w%f", dir)
	return out
}

// waitEvent waits up to 15 s for the line "DELETE path" from a watchDir.
func waitEvent(t *testing.T, events *logBuffer, path string) {
	t.Helper()
	want := "DELETE " + path
	eventually(t, 15*time.Second, "IN_DELETE of "+path, func() (bool, string) {
		for line := range strings.SplitSeq(events.String(), "\n") {
			if line == want {
				return true, ""
			}
		}
		return false, events.String()
	})
}

// countEvents counts the lines "DELETE path" so far.
func countEvents(events *logBuffer, path string) int {
	n := 0
	for line := range strings.SplitSeq(events.String(), "\n") {
		if line == "DELETE "+path {
			n++
		}
	}
	return n
}

// TestWatchSeesEveryEnd checks docs/PROTOCOL.md §6a: a directory watch sees
// IN_DELETE for every end after which the name is free, not only for rm:
// heartbeat expiry, a complete command, the last close of a handle lease
// (in a namespace), and rm.
func TestWatchSeesEveryEnd(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	d := startDaemon(t, daemonOpts{leaseDuration: 2 * time.Second})
	m := d.mountpoint
	if err := os.Mkdir(filepath.Join(m, "ns"), 0o755); err != nil {
		t.Fatal(err)
	}
	events := watchDir(t, m)

	expired := filepath.Join(m, "expired")
	reserve(t, expired) // never renewed: the reaper ends it
	waitEvent(t, events, expired)

	completed := filepath.Join(m, "completed")
	mustSh(t, `python3 -c '
import os, sys
p = sys.argv[1]
fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR)
tok = os.read(fd, 4096).decode().strip()
os.write(fd, f"token = \"{tok}\"\naction = \"complete\"\n".encode())
os.close(fd)
' "$P"`, "P="+completed)
	waitEvent(t, events, completed)

	flocked := filepath.Join(m, "ns", "flocked")
	mustSh(t, `flock -n "$P" true`, "P="+flocked)
	waitEvent(t, events, flocked)

	removed := filepath.Join(m, "removed")
	reserve(t, removed)
	mustSh(t, `rm "$P"`, "P="+removed)
	waitEvent(t, events, removed)

	for _, p := range []string{expired, completed, flocked, removed} {
		if n := countEvents(events, p); n != 1 {
			t.Errorf("%d IN_DELETE of %s, want 1: %s", n, p, events.String())
		}
		// The name is free: reserving it again works, and the new
		// lease stays listed (the self-unlink ended nothing else).
		reserve(t, p)
		if _, err := os.Stat(p); err != nil {
			t.Errorf("the lease reserved again on %s is gone: %v", p, err)
		}
	}
	if strings.Contains(d.stderr(), "level=ERROR") {
		t.Errorf("daemon logged errors:\n%s", d.stderr())
	}
}

// TestWatchHandOverKeepsTheName checks docs/PROTOCOL.md §6a: a handle
// lease handed over to a queued waiter in the same step raises no
// IN_DELETE (the name never was free); the waiter's own end then raises
// one.
func TestWatchHandOverKeepsTheName(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "handed")
	events := watchDir(t, d.mountpoint)
	flag := filepath.Join(t.TempDir(), "waiter-holds")
	// The holder keeps the lease until the waiter is queued (the status
	// document counts it), then lets it go; the waiter is granted in the
	// same step and holds until the listing is done.
	dir := t.TempDir()
	r := sh(t, `
wait_for() { for _ in $(seq 500); do eval "$1" && return 0; sleep 0.02; done; echo "not within 10 s: $1"; exit 1; }
flock -n "$P" sh -c 'touch "$D/held"; until [ -e "$D/release" ]; do sleep 0.02; done' &
holder=$!
wait_for '[ -e "$D/held" ]'
flock "$P" sh -c 'touch "$F"; until [ -e "$D/listed" ]; do sleep 0.02; done' &
waiter=$!
wait_for 'grep -q "^waiters = 1" "$P"'
touch "$D/release"
wait $holder
wait_for '[ -e "$F" ]'
n=$(ls "$(dirname "$P")" | grep -c '^handed$' || true)
echo "listed=$n"
touch "$D/listed"
wait $waiter`, "P="+p, "F="+flag, "D="+dir)
	if r.code != 0 {
		t.Fatalf("hand-over script: %s", r)
	}
	if !strings.Contains(r.stdout, "listed=1") {
		t.Errorf("the handed-over name was not listed while the waiter held it: %s", r.stdout)
	}
	waitEvent(t, events, p)
	time.Sleep(500 * time.Millisecond) // let a second, wrong event arrive
	if n := countEvents(events, p); n != 1 {
		t.Errorf("%d IN_DELETE of %s for a hand-over and an end, want 1 (the end's): %s", n, p, events.String())
	}
}

// TestWatchEtcdEndOnTheOtherMount checks docs/PROTOCOL.md §6a on the etcd
// store: a lease ended through one mount raises IN_DELETE on the other
// mount, whose kernel knows the name.
func TestWatchEtcdEndOnTheOtherMount(t *testing.T) {
	t.Parallel()
	watchEndOnTheOtherMount(t, 0)
}

// TestWatchEtcdEndOnTheOtherMountLater is TestWatchEtcdEndOnTheOtherMount
// with the end 5 s after the other mount's lookup: past the 2 s for which
// a daemon follows a name it only read, the name stays followed because
// its kernel knows it (docs/PROTOCOL.md §8a, "Changes from other mounts").
func TestWatchEtcdEndOnTheOtherMountLater(t *testing.T) {
	t.Parallel()
	watchEndOnTheOtherMount(t, 5*time.Second)
}

// watchEndOnTheOtherMount ends, through mount A, a lease that mount B's
// kernel learned idle earlier, and expects IN_DELETE on B.
func watchEndOnTheOtherMount(t *testing.T, idle time.Duration) {
	requireTool(t, "flock")
	_, a, b := startTwoEtcdDaemons(t, fmt.Sprintf("/watch-%d/", time.Now().UnixNano()))
	pa := filepath.Join(a.mountpoint, "shared")
	pb := filepath.Join(b.mountpoint, "shared")
	reserve(t, pa)
	// b's kernel learns the name.
	eventually(t, 10*time.Second, "the lease seen through the other mount", func() (bool, string) {
		_, err := os.Stat(pb)
		return err == nil, fmt.Sprint(err)
	})
	events := watchDir(t, b.mountpoint) // its start looks the names up once more
	time.Sleep(idle)                    // the daemon's own idle time passes; the kernel's knowledge does not
	mustSh(t, `rm "$P"`, "P="+pa)
	waitEvent(t, events, pb)
	if _, err := os.Stat(pb); !os.IsNotExist(err) {
		t.Errorf("stat %s after the end on the other mount: %v, want ENOENT", pb, err)
	}
}

// TestWatchStopWithEndsPending checks that a daemon stopped while its own
// ends are being unlinked through its mount stops and unmounts promptly
// (docs/ARCHITECTURE.md, "Self-unlinks": the worker stops before the
// unmount).
func TestWatchStopWithEndsPending(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{leaseDuration: time.Second})
	for i := range 200 {
		mustSh(t, `set -C; : > "$P"`, "P="+filepath.Join(d.mountpoint, fmt.Sprintf("n%03d", i)))
	}
	eventually(t, 10*time.Second, "the reaper ending the first of them", func() (bool, string) {
		n := len(listMount(t, d.mountpoint))
		return n < 200, fmt.Sprintf("%d names listed", n)
	})
	start := time.Now()
	d.stop(true)
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("stopping took %v with self-unlinks pending", took)
	}
}
