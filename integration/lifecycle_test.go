package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCreateRace forks 24 python3 processes that wait on one pipe (the barrier) and then all
// open the same name with O_CREAT|O_EXCL: exactly one must win.
func TestCreateRace(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	r := py(t, `
p = os.path.join(M, "contested")
r, w = os.pipe()
kids = []
for i in range(24):
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)  # returns b"" for everyone at once when the parent closes w
        fd, res = call(os.open, p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(1, ("%d %s\n" % (os.getpid(), res)).encode())
        os._exit(0)
    kids.append(pid)
os.close(r)
os.close(w)
for k in kids:
    os.waitpid(k, 0)
`, "M="+d.mountpoint)
	if r.code != 0 {
		t.Fatalf("race script: %s", r)
	}
	counts := map[string]int{}
	winner := ""
	for line := range strings.SplitSeq(strings.TrimSpace(r.stdout), "\n") {
		pid, res, _ := strings.Cut(line, " ")
		counts[res]++
		if res == "ok" {
			winner = pid
		}
	}
	if counts["ok"] != 1 || counts["EEXIST"] != 23 {
		t.Fatalf("24 racing O_CREAT|O_EXCL opens: %v, want 1 ok and 23 EEXIST\n%s", counts, r.stdout)
	}
	p := filepath.Join(d.mountpoint, "contested")
	readToken(t, p)
	st, _ := statusDoc(t, p)
	if st["holder_pid"] != winner {
		t.Errorf("holder_pid = %q, want the winning process %s", st["holder_pid"], winner)
	}
	n := 0
	for _, e := range cliJSON(t, "ls", "--state", d.state, "--json") {
		if fmt.Sprint(e["resource"]) == "contested" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("leasefs ls shows %d live leases on contested, want 1", n)
	}
}

// TestExpiry checks that an unrenewed token lease disappears after --lease-duration without
// anyone touching it, that the name can be reserved again at once, and that history records
// the first lease as abandoned.
func TestExpiry(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	d := startDaemon(t, daemonOpts{leaseDuration: ttl})
	p := filepath.Join(d.mountpoint, "expiring")
	start := time.Now()
	reserve(t, p)
	st, _ := statusDoc(t, p)
	if e, h := statusTime(t, st, "expires_at"), statusTime(t, st, "heartbeat_at"); e.Sub(h) != ttl {
		t.Errorf("expires_at - heartbeat_at = %v, want %v", e.Sub(h), ttl)
	}
	eventually(t, 10*time.Second, "expired lease leaves the listing", func() (bool, string) {
		names := listMount(t, d.mountpoint)
		return !slices.Contains(names, "expiring"), fmt.Sprint(names)
	})
	if gone := time.Since(start); gone < ttl-100*time.Millisecond {
		t.Errorf("lease disappeared %v after the reservation began, before its %v duration", gone, ttl)
	}
	kv := pyKV(t, `
fd, res = call(os.open, os.path.join(M, "expiring"), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
out("recreate", res)
if fd is not None:
    out("token", os.read(fd, 4096))
`, "M="+d.mountpoint)
	wantKV(t, kv, "recreate", "ok")
	if !tokenRE.MatchString(kv["token"]) {
		t.Errorf("re-reserved lease's first read = %q, want a token", kv["token"])
	}
	h := findLease(cliJSON(t, "history", "--state", d.state, "expiring", "--json"), st["lease_id"])
	if h == nil || fmt.Sprint(h["status"]) != "abandoned" {
		t.Errorf("history of the expired lease %s: %v, want status abandoned", st["lease_id"], h)
	}
}

// TestStaleHandle checks that a descriptor opened on a lease answers ESTALE once the lease is
// released and the name re-reserved, and that the new lease is a new inode.
func TestStaleHandle(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "reused")
	tok := reserve(t, p)
	kv := pyKV(t, `
import subprocess
p = os.path.join(M, "reused")
fd = os.open(p, os.O_RDWR)
out("ino_old", os.fstat(fd).st_ino)
out("read_before", err(os.pread, fd, 4096, 0))
subprocess.run(["bash", "-c", 'rm "$P" && set -C && : > "$P"'], env=dict(os.environ, P=p), check=True)
out("ino_new", os.stat(p).st_ino)
out("read_old", err(os.pread, fd, 4096, 0))
out("write_old", err(os.pwrite, fd, (os.environ["TOK"] + "\n").encode(), 0))
st = os.fstat(fd)
out("fstat_old", "ino %d nlink %d" % (st.st_ino, st.st_nlink))
out("ftruncate_old", err(os.ftruncate, fd, 0))
os.close(fd)
`, "M="+d.mountpoint, "TOK="+tok)
	wantKV(t, kv, "read_before", "ok")
	wantKV(t, kv, "read_old", "ESTALE")
	wantKV(t, kv, "write_old", "ESTALE")
	// fstat and ftruncate never answer ESTALE: the ended lease, unlinked (docs/PROTOCOL.md §3).
	wantKV(t, kv, "fstat_old", "ino "+kv["ino_old"]+" nlink 0")
	wantKV(t, kv, "ftruncate_old", "ok")
	if kv["ino_old"] == "" || kv["ino_old"] == kv["ino_new"] {
		t.Errorf("inode of the old lease %q, of the new lease %q: want different", kv["ino_old"], kv["ino_new"])
	}
}

// TestRestartKeepsTokenLease stops the daemon cleanly and starts another on the same state:
// the lease survives with the same heartbeat and expiry, and its token still renews.
func TestRestartKeepsTokenLease(t *testing.T) {
	t.Parallel()
	d1 := startDaemon(t, daemonOpts{})
	p := filepath.Join(d1.mountpoint, "durable")
	tok := reserve(t, p)
	st1, _ := statusDoc(t, p)
	d1.stop(true)
	if n := mountCount(t, d1.mountpoint); n != 0 {
		t.Errorf("after SIGTERM %d mounts remain on %s", n, d1.mountpoint)
	}

	d2 := startDaemon(t, daemonOpts{mountpoint: d1.mountpoint, state: d1.state})
	st2, _ := statusDoc(t, p)
	for _, k := range []string{"lease_id", "status", "mode", "heartbeat_at", "expires_at", "generation"} {
		if st1[k] != st2[k] {
			t.Errorf("after restart %s = %q, want %q", k, st2[k], st1[k])
		}
	}
	if r := sh(t, `echo "$TOK" >| "$P"`, "P="+p, "TOK="+tok); r.code != 0 {
		t.Fatalf("renew after restart: %s\ndaemon stderr:\n%s", r, d2.stderr())
	}
	st3, _ := statusDoc(t, p)
	if !statusTime(t, st3, "expires_at").After(statusTime(t, st1, "expires_at")) {
		t.Errorf("renew after restart: expires_at %s, want later than %s", st3["expires_at"], st1["expires_at"])
	}
}

// TestKilledDaemonStaleMount SIGKILLs the daemon, checks the mountpoint answers ENOTCONN, and
// starts a new daemon on the same mountpoint: it cleans the stale mount and serves the lease.
func TestKilledDaemonStaleMount(t *testing.T) {
	t.Parallel()
	d1 := startDaemon(t, daemonOpts{})
	p := filepath.Join(d1.mountpoint, "survivor")
	tok := reserve(t, p)
	st1, _ := statusDoc(t, p)
	d1.kill()
	var s unix.Stat_t
	if err := unix.Stat(d1.mountpoint, &s); !errors.Is(err, unix.ENOTCONN) {
		t.Errorf("stat of the killed daemon's mountpoint: %v, want ENOTCONN", err)
	}

	startDaemon(t, daemonOpts{mountpoint: d1.mountpoint, state: d1.state})
	if n := mountCount(t, d1.mountpoint); n != 1 {
		t.Errorf("%d mounts on %s after restart, want 1 (the stale one detached)", n, d1.mountpoint)
	}
	st2, _ := statusDoc(t, p)
	if st2["lease_id"] != st1["lease_id"] || st2["status"] != "active" {
		t.Errorf("after the crash the lease is %v, want %s active", st2, st1["lease_id"])
	}
	if r := sh(t, `echo "$TOK" >| "$P"`, "P="+p, "TOK="+tok); r.code != 0 {
		t.Errorf("renew after crash and restart: %s", r)
	}
}

// TestSecondDaemonRefused starts a second daemon on the same state (another mountpoint): it
// must exit at once with code 3 and name the first daemon's pid.
func TestSecondDaemonRefused(t *testing.T) {
	t.Parallel()
	d1 := startDaemon(t, daemonOpts{})
	mp2 := t.TempDir()
	t.Cleanup(func() { detach(t, mp2) })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	argv := withStore([]string{leasefsBin, "mount", "--state", d1.state, mp2})
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	_ = cmd.Run()
	took := time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("second daemon on the same state still running after 10s; stderr:\n%s", stderr.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 3 {
		t.Errorf("second daemon exit code %d, want 3; stderr:\n%s", code, stderr.String())
	}
	if took > 5*time.Second {
		t.Errorf("second daemon took %v to give up, want at once", took)
	}
	msg := stderr.String()
	pidRE := regexp.MustCompile(`\bpid ` + strconv.Itoa(d1.pid) + `\b`)
	if !strings.Contains(msg, "held by") || !pidRE.MatchString(msg) {
		t.Errorf("second daemon's stderr does not say the state is held by pid %d:\n%s", d1.pid, msg)
	}
	if n := mountCount(t, mp2); n != 0 {
		t.Errorf("refused daemon left %d mounts on %s", n, mp2)
	}
	if !d1.running() {
		t.Errorf("first daemon exited; stderr:\n%s", d1.stderr())
	}
	if _, err := os.Stat(d1.mountpoint); err != nil {
		t.Errorf("first daemon's mount no longer answers: %v", err)
	}
}

// TestMountOnAnotherStatesMount mounts a new state directory on a mountpoint that a live
// daemon of another state directory serves: refused at once with exit 1 and a message that
// names the mountpoint, before the new state directory is created; the first mount serves on.
func TestMountOnAnotherStatesMount(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	state := filepath.Join(t.TempDir(), "other")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	argv := withStore([]string{leasefsBin, "mount", "--state", state, d.mountpoint})
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	var stderr strings.Builder
	cmd.Stderr = &stderr
	_ = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("mount on a served mountpoint still running after 10s; stderr:\n%s", stderr.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("mount on a served mountpoint: exit code %d, want 1; stderr:\n%s", code, stderr.String())
	}
	want := "leasefs: mountpoint already has a leasefs mount: " + d.mountpoint +
		" is served by a live daemon of another state directory; unmount it first"
	if !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr:\n%s\nwant the line %q", stderr.String(), want)
	}
	if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused mount created its state directory %s: stat = %v", state, err)
	}
	if n := mountCount(t, d.mountpoint); n != 1 {
		t.Errorf("%d mounts on %s after the refusal, want the first daemon's alone", n, d.mountpoint)
	}
	mustSh(t, `set -C; : > "$P"`, "P="+filepath.Join(d.mountpoint, "still-served"))
}

// TestMountInsideAMount mounts a new state directory on a namespace of a live mount: refused
// with exit 1 and a message naming both, before the new state directory is created
// (docs/PROTOCOL.md §2, "Refused set-ups"); the namespace can be removed afterwards.
func TestMountInsideAMount(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	ns := filepath.Join(d.mountpoint, "ci")
	if err := os.Mkdir(ns, 0o755); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "other")
	r := runClient(t, nil, withStore([]string{leasefsBin, "mount", "--state", state, ns})...)
	want := "leasefs: the mountpoint must not be inside a leasefs mount: " + ns + " is inside the leasefs mount " + d.mountpoint
	if r.code != 1 || !strings.Contains(r.stderr, want) {
		t.Errorf("mount on a namespace of a live mount: %s\nwant exit 1 and %q", r, want)
	}
	if _, err := os.Stat(state); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused mount created its state directory %s: stat = %v", state, err)
	}
	if err := os.Remove(ns); err != nil {
		t.Errorf("rmdir of the namespace after the refusal: %v", err)
	}
}

// TestInotify watches the mount root with inotifywait and checks that a reserve, a renew and a
// release through the mount raise CREATE, MODIFY and DELETE.
func TestInotify(t *testing.T) {
	t.Parallel()
	tool := requireTool(t, "inotifywait")
	d := startDaemon(t, daemonOpts{})
	stdout, _ := startInotifywait(t, tool, "-m", "-e", "create", "-e", "modify", "-e", "delete", "--format", "%e %f", d.mountpoint)

	p := filepath.Join(d.mountpoint, "watched")
	tok := reserve(t, p)
	mustSh(t, `echo "$TOK" >| "$P"; rm "$P"`, "P="+p, "TOK="+tok)
	for _, ev := range []string{"CREATE watched", "MODIFY watched", "DELETE watched"} {
		eventually(t, 5*time.Second, "inotify event "+ev, func() (bool, string) {
			out := stdout.String()
			return regexp.MustCompile(`(?m)^` + ev + `$`).MatchString(out), out
		})
	}
}
