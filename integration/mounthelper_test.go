package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/internal/testenv"
	"github.com/leasefs/leasefs/mount"
)

// The mount helper form (docs/PROTOCOL.md §8b) is tested through the real
// mount(8) and mount.fuse3. mount(8) runs its helpers with a fixed PATH
// (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin, whatever
// the caller's), and mount.fuse3 finds the subtype program "leasefs" in it.
// So each mount runs in a mount namespace of its own in which the directory
// of the binary under test is bind-mounted on /usr/local/sbin: nothing of
// the machine changes, and the FUSE mount lives in that namespace, kept by
// the background daemon. The test reaches the mount with nsenter(1) into the
// daemon's namespace, which goes away with the daemon.

// helperLog is the daemon's log in the state directory when the mount
// helper form started it.
const helperLog = "leasefs.log"

// requireHelperTools skips (or fails) unless mount(8), mount.fuse3, unshare
// and nsenter are there.
func requireHelperTools(t *testing.T) {
	t.Helper()
	testenv.RequireFUSE(t)
	for _, tool := range []string{"mount", "umount", "unshare", "nsenter"} {
		requireTool(t, tool)
	}
	if _, err := os.Stat("/sbin/mount.fuse3"); err != nil {
		if _, err := os.Stat("/usr/sbin/mount.fuse3"); err != nil {
			testenv.SkipOrFail(t, "mount.fuse3 not installed (fuse3)")
		}
	}
	if st, err := os.Stat("/usr/local/sbin"); err != nil || !st.IsDir() {
		testenv.SkipOrFail(t, "/usr/local/sbin is not a directory: %v", err)
	}
}

// helperMountpoint returns a new mountpoint, symlinks resolved as mountinfo
// shows them.
func helperMountpoint(t *testing.T) string {
	t.Helper()
	mp := t.TempDir()
	if real, err := filepath.EvalSymlinks(mp); err == nil {
		mp = real
	}
	return mp
}

// mountInNamespace runs `mount ARGS...` in a new private mount namespace
// where leasefs is found in mount(8)'s PATH (see the top of this file).
func mountInNamespace(t *testing.T, args ...string) result {
	t.Helper()
	script := `mount --bind "$0" /usr/local/sbin && exec mount "$@"`
	argv := append([]string{"unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script,
		filepath.Dir(leasefsBin)}, args...)
	return runClient(t, nil, argv...)
}

// inDaemonNamespace runs a bash script with args ($0, $1, …) in the mount
// namespace of the process pid.
func inDaemonNamespace(t *testing.T, pid int, script string, args ...string) result {
	t.Helper()
	argv := append([]string{"nsenter", "--target", strconv.Itoa(pid), "--mount", "--", "bash", "-c", script}, args...)
	return runClient(t, nil, argv...)
}

// servingPID returns the pid of the daemon holding the lock of state, and
// whether one does.
func servingPID(state string) (int, bool) {
	lockPath := filepath.Join(state, mount.DaemonLockName)
	if held, ok := daemonlock.Held(lockPath); !ok || !held {
		return 0, false
	}
	h, ok := daemonlock.ReadHolder(lockPath)
	return h.PID, ok && h.PID > 0
}

// waitPID waits up to timeout for the process pid, which is not a child of
// the test, to exit, and reports whether it did.
func waitPID(pid int, timeout time.Duration) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return errors.Is(err, unix.ESRCH)
	}
	defer unix.Close(fd)
	for end := time.Now().Add(timeout); ; {
		left := time.Until(end)
		if left <= 0 {
			return false
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left.Milliseconds())+1)
		if err == nil && n > 0 {
			return true
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false
		}
	}
}

// cleanupHelperDaemon makes sure that at the end of the test no daemon
// serves state and nothing is mounted on mp: a daemon the mount helper
// started in the background is unmounted (in its namespace), then stopped
// with SIGTERM and, after 10 s, SIGKILL. It also fails the test on a data
// race the daemon reported in its log.
func cleanupHelperDaemon(t *testing.T, state, mp string) {
	t.Helper()
	t.Cleanup(func() {
		if pid, ok := servingPID(state); ok {
			_ = runClient(t, nil, "nsenter", "--target", strconv.Itoa(pid), "--mount", "--", "umount", "--lazy", mp)
			if !waitPID(pid, 5*time.Second) {
				t.Logf("stopping leasefs pid %d, which still serves %s", pid, state)
				_ = syscall.Kill(pid, syscall.SIGTERM)
				if !waitPID(pid, 10*time.Second) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					if !waitPID(pid, 5*time.Second) {
						t.Errorf("leasefs pid %d did not exit after SIGKILL", pid)
					}
				}
			}
		}
		detach(t, mp) // in case the mount leaked into this namespace
		log, _ := os.ReadFile(filepath.Join(state, helperLog))
		for _, r := range raceReports(string(log)) {
			t.Errorf("the race detector found a data race in the background daemon:\n%s", r)
		}
	})
}

// helperStatus is what `leasefs status --json` reports of a store.
type helperStatus struct {
	Served     bool           `json:"served"`
	PID        int            `json:"pid"`
	Mountpoint string         `json:"mountpoint"`
	Leases     map[string]int `json:"leases"`
}

// statusOf runs `leasefs status --state state --json`.
func statusOf(t *testing.T, state string) (helperStatus, result) {
	t.Helper()
	r := runClient(t, nil, leasefsBin, "status", "--state", state, "--json")
	var st helperStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("leasefs status --json: %v\n%s", err, r)
	}
	return st, r
}

// checkHelperMount checks a mount of state on mp that mount(8) made through
// the mount helper form and has just reported done: the daemon runs in the
// background, detached, logging to the state directory; the mount answers
// (a lease is reserved with bash); status reports it served. Then it
// unmounts mp with umount(8) and checks that the daemon exits and nothing
// serves state any more.
func checkHelperMount(t *testing.T, state, mp string) {
	t.Helper()
	st, r := statusOf(t, state)
	if r.code != 0 || !st.Served || st.PID <= 0 || st.Mountpoint != mp {
		t.Fatalf("after mount: status %s, want served on %s", r, mp)
	}
	pid := st.PID

	// Detached: a session of its own, stdin /dev/null, stdout and stderr
	// appended to <state>/leasefs.log.
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(fields) < 4 || fields[3] != strconv.Itoa(pid) {
		t.Errorf("daemon pid %d: session %v, want a session of its own", pid, fields)
	}
	for fd, want := range map[int]string{0: os.DevNull, 1: filepath.Join(state, helperLog), 2: filepath.Join(state, helperLog)} {
		if got, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd)); err != nil || got != want {
			t.Errorf("daemon fd %d is %q (%v), want %s", fd, got, err, want)
		}
	}
	log, err := os.ReadFile(filepath.Join(state, helperLog))
	if err != nil || !strings.Contains(string(log), "msg=mounted") || !strings.Contains(string(log), "lease_duration=1m0s") {
		t.Errorf("the daemon's log (%v) lacks its mounted line with lease_duration=1m0s:\n%s", err, log)
	}

	// The mount, in the daemon's namespace, with the state directory as its
	// source, and it answers.
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for line := range strings.SplitSeq(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) > 9 && f[4] == mp {
			found = true
			if sep := strings.Index(line, " - "); sep < 0 || !strings.HasPrefix(line[sep+3:], "fuse.leasefs "+state+" ") {
				t.Errorf("mountinfo of %s: %q, want type fuse.leasefs, source %s", mp, line, state)
			}
		}
	}
	if !found {
		t.Fatalf("no mount on %s in the daemon's namespace:\n%s", mp, mi)
	}
	r = inDaemonNamespace(t, pid, `set -eC; : > "$0/job"; tok=$(cat "$0/job"); [[ $tok == hwl_* ]]; cat "$0/job"`, mp)
	if r.code != 0 || !strings.Contains(r.stdout, `resource = "job"`) {
		t.Fatalf("reserving a lease through the mount: %s", r)
	}
	if st, r := statusOf(t, state); r.code != 0 || !st.Served || st.PID != pid || st.Leases["token"] != 1 {
		t.Errorf("status with a lease: %s, want served by pid %d with 1 token lease", r, pid)
	}

	// umount(8) ends the daemon.
	if r := runClient(t, nil, "nsenter", "--target", strconv.Itoa(pid), "--mount", "--", "umount", mp); r.code != 0 {
		t.Fatalf("umount %s: %s", mp, r)
	}
	if !waitPID(pid, 15*time.Second) {
		t.Fatalf("daemon pid %d still runs 15 s after umount", pid)
	}
	if st, r := statusOf(t, state); r.code != 1 || st.Served {
		t.Errorf("status after umount: %s, want not served (exit 1)", r)
	}
	if log, _ := os.ReadFile(filepath.Join(state, helperLog)); !strings.Contains(string(log), "msg=stopped") {
		t.Errorf("the daemon's log lacks its stopped line:\n%s", log)
	}
}

// `mount -t fuse.leasefs STATE MOUNTPOINT -o OPTIONS` returns once the mount
// answers, leaving the daemon in the background; umount ends it.
func TestMountHelperMountCommand(t *testing.T) {
	fileStoreOnly(t, "the mount helper mounts the file store of its state= option")
	t.Parallel()
	requireHelperTools(t)
	state := filepath.Join(t.TempDir(), "state")
	mp := helperMountpoint(t)
	cleanupHelperDaemon(t, state, mp)
	if r := mountInNamespace(t, "-t", "fuse.leasefs", state, mp, "-o", "lease_duration=60s"); r.code != 0 {
		log, _ := os.ReadFile(filepath.Join(state, helperLog))
		t.Fatalf("mount -t fuse.leasefs: %s\ndaemon log:\n%s", r, log)
	}
	checkHelperMount(t, state, mp)
}

// An fstab line of type fuse.leasefs mounts with `mount MOUNTPOINT` (here
// from an fstab of the test's, `mount -T FILE`), and `mount -a` then sees it
// mounted instead of starting a second daemon.
func TestFstabMount(t *testing.T) {
	fileStoreOnly(t, "the mount helper mounts the file store of its state= option")
	t.Parallel()
	requireHelperTools(t)
	state := filepath.Join(t.TempDir(), "state")
	mp := helperMountpoint(t)
	cleanupHelperDaemon(t, state, mp)
	fstab := filepath.Join(t.TempDir(), "fstab")
	line := fmt.Sprintf("%s %s fuse.leasefs lease_duration=60s,nofail 0 0\n", state, mp)
	if err := os.WriteFile(fstab, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	// Both mounts run in one namespace: the second sees the first.
	script := `mount --bind "$0" /usr/local/sbin && mount -T "$1" "$2" && echo mounted && mount -a -v -T "$1"`
	r := runClient(t, nil, "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script,
		filepath.Dir(leasefsBin), fstab, mp)
	if r.code != 0 || !strings.Contains(r.stdout, "mounted") {
		log, _ := os.ReadFile(filepath.Join(state, helperLog))
		t.Fatalf("mount -T %s %s, then mount -a: %s\ndaemon log:\n%s", fstab, mp, r, log)
	}
	if !strings.Contains(r.stdout+r.stderr, "already mounted") {
		t.Errorf("mount -a did not report the fstab line already mounted: %s", r)
	}
	checkHelperMount(t, state, mp)
}

// The mount helper fails with the reason and the exit code of the failure:
// 2 for an unknown option, before anything is created; 3 with the holder
// named when another daemon serves the state directory, whose daemon is
// gone by the time mount returns.
func TestMountHelperFailures(t *testing.T) {
	t.Parallel()
	requireHelperTools(t)
	state := filepath.Join(t.TempDir(), "state")
	mp := helperMountpoint(t)
	cleanupHelperDaemon(t, state, mp)
	r := mountInNamespace(t, "-t", "fuse.leasefs", state, mp, "-o", "lease_duration=60s,colour=red")
	if r.code != 2 || !strings.Contains(r.stderr, `unknown mount option "colour=red"`) {
		t.Errorf("mount with an unknown option: %s, want exit 2 naming it", r)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("a refused option created the state directory: %v", err)
	}

	d := startDaemon(t, daemonOpts{state: state})
	r = mountInNamespace(t, "-t", "fuse.leasefs", state, mp)
	if r.code != 3 || !strings.Contains(r.stderr, "is held by leasefs mount "+d.mountpoint) ||
		!strings.Contains(r.stderr, "before the mount answered") {
		t.Errorf("mount of a served state directory: %s, want exit 3 naming the holder", r)
	}
	if pid, ok := servingPID(state); !ok || pid != d.pid {
		t.Errorf("after the refused mount the state directory is served by pid %d (%v), want the first daemon %d", pid, ok, d.pid)
	}
	d.stop(true)
}
