package integration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Handle leases (docs/PROTOCOL.md §6): flock(2) and whole-file fcntl/lockf write locks on lease files,
// driven by flock(1), bash and python3 clients.

// holdTimeout bounds every wait for a background client to report that it holds or got a lock.
const holdTimeout = 15 * time.Second

// waitWaiters polls the status document of p until it shows n blocked lock waiters (an absent
// waiters key counts as 0). The lease on p must not have an unread token: reading it as root
// would reveal it.
func waitWaiters(t testing.TB, p string, n int) {
	t.Helper()
	eventually(t, 10*time.Second, fmt.Sprintf("status of %s shows waiters = %d", p, n), func() (bool, string) {
		r := sh(t, `cat "$P"`, "P="+p)
		if r.code != 0 {
			return false, r.String()
		}
		if tokenRE.MatchString(r.stdout) {
			t.Fatalf("reading %s to count waiters revealed its token", p)
		}
		w := parseStatus(t, r.stdout)["waiters"]
		if w == "" {
			w = "0"
		}
		return w == strconv.Itoa(n), r.stdout
	})
}

// liveLeases returns the live leases on resource according to `leasefs ls --json` (which reads
// the store, not the mount, so it never reveals a token).
func liveLeases(t testing.TB, state, resource string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, e := range cliJSON(t, "ls", "--state", state, "--json") {
		if fmt.Sprint(e["resource"]) == resource {
			out = append(out, e)
		}
	}
	return out
}

// waitGone waits until name is no longer listed in dir.
func waitGone(t testing.TB, dir, name, why string) {
	t.Helper()
	eventually(t, 5*time.Second, why, func() (bool, string) {
		names := listMount(t, dir)
		return !slices.Contains(names, name), fmt.Sprint(names)
	})
}

// wantHistory checks that history records lease id on resource with status want.
func wantHistory(t testing.TB, state, resource, id, want string) {
	t.Helper()
	h := findLease(cliJSON(t, "history", "--state", state, resource, "--json"), id)
	if h == nil || fmt.Sprint(h["status"]) != want {
		t.Errorf("history of lease %s on %s: %v, want status %s", id, resource, h, want)
	}
}

// wantHandle checks that status document st is an active handle lease on resource, without
// an expiry.
func wantHandle(t testing.TB, st map[string]string, resource string) {
	t.Helper()
	if st["mode"] != "handle" || st["status"] != "active" || st["resource"] != resource {
		t.Errorf("status = %v, want an active handle lease on %s", st, resource)
	}
	if e, ok := st["expires_at"]; ok {
		t.Errorf("handle lease on %s has expires_at = %s, want none (handle leases never expire by time)", resource, e)
	}
}

// pyFlockHolder is a python3 client that reserves $P with O_CREAT|O_EXCL|O_RDWR, takes
// flock(LOCK_EX) on it, reports out("held", pid) and then waits for stdin to close.
const pyFlockHolder = `
import fcntl
fd = os.open(os.environ["P"], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
out("held", os.getpid())
sys.stdin.read()
`

// TestFlockHandleLease holds a lease with flock(1): it is a handle lease while the command
// runs, a second non-blocking flock is refused, and the lease ends when the command ends.
func TestFlockHandleLease(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "session-1")
	r := mustSh(t, `flock -n "$P" -c 'cat "$P"; flock -n "$P" true; echo "inner=$?"'`, "P="+p)
	if strings.Contains(r.stdout, "hwl_") {
		t.Errorf("a read inside the flock holder revealed the token:\n%s", r.stdout)
	}
	st := parseStatus(t, strings.Split(r.stdout, "inner=")[0])
	wantHandle(t, st, "session-1")
	if !strings.Contains(r.stdout, "inner=1") {
		t.Errorf("a second flock -n on the held name did not fail with exit 1:\n%s", r)
	}
	waitGone(t, d.mountpoint, "session-1", "handle lease ends with its flock")
	wantHistory(t, d.state, "session-1", st["lease_id"], "complete")
}

// TestFlockKilledHolder SIGKILLs a flock(1) holder (its whole process group: flock forks the
// command, which inherits the locked descriptor): the lease ends at once, without a TTL, and a
// waiting flock gets the name.
func TestFlockKilledHolder(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "job")
	holder := startProc(t, nil, "flock", "-n", p, "-c", "echo held; exec sleep 60")
	holder.expect(`(?m)^held$`, holdTimeout)

	st, _ := statusDoc(t, p)
	wantHandle(t, st, "job")
	if st["holder_pid"] != strconv.Itoa(holder.pid) {
		t.Errorf("holder_pid = %q, want the flock process %d", st["holder_pid"], holder.pid)
	}
	if r := sh(t, `flock -n "$P" true`, "P="+p); r.code != 1 {
		t.Errorf("flock -n on a held handle lease: %s\nwant exit 1 (EWOULDBLOCK)", r)
	}

	holder.killGroup()
	holder.wait(10 * time.Second)
	if r := sh(t, `flock -w 5 "$P" true`, "P="+p); r.code != 0 {
		t.Errorf("flock -w 5 after SIGKILL of the holder: %s\ndaemon stderr:\n%s", r, d.stderr())
	}
	wantHistory(t, d.state, "job", st["lease_id"], "complete")
}

// TestFlockInheritance checks fork semantics with flock(1): without -o the command inherits
// the locked descriptor, so killing only flock(1) leaves the lease held by the command; with
// -o flock(1) closes it before exec, so killing flock(1) ends the lease while the command runs.
func TestFlockInheritance(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	d := startDaemon(t, daemonOpts{})

	p := filepath.Join(d.mountpoint, "inherited")
	// The command's output goes to /dev/null so that it does not keep flock(1)'s stdout open.
	holder := startProc(t, nil, "flock", "-n", p, "-c", "echo held; exec sleep 60 >/dev/null 2>&1")
	holder.expect(`(?m)^held$`, holdTimeout)
	st, _ := statusDoc(t, p)
	holder.signal(syscall.SIGKILL) // flock(1) only; its child `sleep` keeps the descriptor
	holder.wait(10 * time.Second)
	if r := sh(t, `flock -n "$P" true`, "P="+p); r.code != 1 {
		t.Errorf("flock -n while the command that inherited the descriptor runs: %s\nwant exit 1", r)
	}
	if st2, _ := statusDoc(t, p); st2["lease_id"] != st["lease_id"] || st2["status"] != "active" {
		t.Errorf("after flock(1) died the lease is %v, want %s still active", st2, st["lease_id"])
	}
	holder.killGroup() // now the command too
	waitGone(t, d.mountpoint, "inherited", "lease ends when the last holder of the descriptor dies")
	wantHistory(t, d.state, "inherited", st["lease_id"], "complete")

	p = filepath.Join(d.mountpoint, "not-inherited")
	holder = startProc(t, nil, "flock", "-o", "-n", p, "-c", "echo held; exec sleep 60 >/dev/null 2>&1")
	holder.expect(`(?m)^held$`, holdTimeout)
	st, _ = statusDoc(t, p)
	wantHandle(t, st, "not-inherited")
	holder.signal(syscall.SIGKILL) // flock(1) only; with -o the command has no descriptor
	holder.wait(10 * time.Second)
	waitGone(t, d.mountpoint, "not-inherited", "with flock -o the lease ends with flock(1)")
	wantHistory(t, d.state, "not-inherited", st["lease_id"], "complete")
}

// TestFlockWaiterRunsAfterHolder starts a blocking flock(1) while a holder works for 1.5 s:
// the waiter shows in the status document, runs only after the holder is done, and gets a
// new lease.
func TestFlockWaiterRunsAfterHolder(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "q")
	order := filepath.Join(t.TempDir(), "order")
	env := []string{"P=" + p, "F=" + order}
	holder := startProc(t, env, "flock", "-n", p, "-c", `echo held; read -r _; sleep 1.5; echo holder >> "$F"`)
	holder.expect(`(?m)^held$`, holdTimeout)
	st, _ := statusDoc(t, p)

	waiter := startProc(t, env, "flock", p, "-c", `echo waiter >> "$F"`)
	waitWaiters(t, p, 1)
	start := time.Now()
	holder.send("go") // the holder works for 1.5 s from now, then exits
	wr := waiter.wait(20 * time.Second)
	took := time.Since(start)
	if hr := holder.wait(5 * time.Second); hr.code != 0 {
		t.Errorf("holder: %s", hr)
	}
	if wr.code != 0 {
		t.Fatalf("blocking flock waiter: %s\ndaemon stderr:\n%s", wr, d.stderr())
	}
	if took < 1500*time.Millisecond {
		t.Errorf("the waiter finished %v after the holder started its 1.5 s of work", took)
	}
	if got, _ := os.ReadFile(order); string(got) != "holder\nwaiter\n" {
		t.Errorf("order of work = %q, want the holder's then the waiter's", got)
	}
	waitGone(t, d.mountpoint, "q", "the waiter's lease ends with it")
	hist := cliJSON(t, "history", "--state", d.state, "q", "--json")
	if len(hist) != 2 {
		t.Fatalf("history of q has %d leases, want 2 (holder, waiter): %v", len(hist), hist)
	}
	for _, h := range hist {
		if fmt.Sprint(h["status"]) != "complete" || fmt.Sprint(h["mode"]) != "handle" {
			t.Errorf("history entry %v, want a complete handle lease", h)
		}
		if id := fmt.Sprint(h["lease_id"]); id != st["lease_id"] && fmt.Sprint(h["holder_pid"]) != strconv.Itoa(waiter.pid) {
			t.Errorf("the waiter's lease %s has holder_pid %v, want the waiter %d", id, h["holder_pid"], waiter.pid)
		}
	}
}

// TestFlockWaitersFIFO queues blocking flock(1) waiters in a known order (each started only
// once the previous one shows in the waiters count) and checks they are served first come,
// first served; a waiter killed while queued (X) leaves the queue without disturbing it.
func TestFlockWaitersFIFO(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "fifo")
	order := filepath.Join(t.TempDir(), "order")
	holder := startProc(t, nil, "flock", "-n", p, "-c", "echo held; exec sleep 60")
	holder.expect(`(?m)^held$`, holdTimeout)

	waiters := map[string]*bgProc{}
	for i, name := range []string{"A", "B", "X", "C"} {
		waiters[name] = startProc(t, []string{"F=" + order, "N=" + name}, "flock", p, "-c", `echo "$N" >> "$F"`)
		waitWaiters(t, p, i+1)
	}
	waiters["X"].killGroup()
	waiters["X"].wait(10 * time.Second)
	waitWaiters(t, p, 3)
	holder.killGroup()
	for _, name := range []string{"A", "B", "C"} {
		if r := waiters[name].wait(20 * time.Second); r.code != 0 {
			t.Errorf("waiter %s: %s", name, r)
		}
	}
	if got, _ := os.ReadFile(order); string(got) != "A\nB\nC\n" {
		t.Errorf("waiters served in order %q, want A, B, C (arrival order, X killed while waiting)", got)
	}
	waitGone(t, d.mountpoint, "fifo", "the last waiter's lease ends with it")
}

// TestFlockOnTokenLease checks a token lease reserved by a shell that does not lock: another
// process's flock -n is refused, but a process that presents the token binds the same lease
// to its open file (mode handle, no expiry), and closing that file frees the name.
func TestFlockOnTokenLease(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "tok")
	tok := reserve(t, p)
	st0, _ := statusDoc(t, p)
	if st0["mode"] != "token" {
		t.Fatalf("reserved with set -C: mode %q, want token", st0["mode"])
	}
	if r := sh(t, `flock -n "$P" true`, "P="+p); r.code != 1 {
		t.Errorf("flock -n on a token lease held by another process: %s\nwant exit 1 (EWOULDBLOCK)", r)
	}
	kv := pyKV(t, `
import fcntl, subprocess
p = os.environ["P"]
fd = os.open(p, os.O_RDWR)
out("flock_before_token", err(fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
out("renew", err(os.write, fd, (os.environ["TOK"] + "\n").encode()))
out("flock", err(fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
out("status", subprocess.run(["cat", p], capture_output=True, text=True).stdout)
out("other", subprocess.run(["flock", "-n", p, "true"]).returncode)
os.close(fd)
`, "P="+p, "TOK="+tok)
	if v := kv["flock_before_token"]; v != "EAGAIN" && v != "EWOULDBLOCK" {
		t.Errorf("flock before presenting the token = %q, want EWOULDBLOCK", v)
	}
	wantKV(t, kv, "renew", "ok")
	wantKV(t, kv, "flock", "ok")
	wantKV(t, kv, "other", "1")
	st := parseStatus(t, kv["status"])
	wantHandle(t, st, "tok")
	if st["lease_id"] != st0["lease_id"] {
		t.Errorf("flock after the token bound lease %q, want the token lease %s itself", st["lease_id"], st0["lease_id"])
	}
	waitGone(t, d.mountpoint, "tok", "the bound token lease ends with its open file")
	wantHistory(t, d.state, "tok", st0["lease_id"], "complete")
}

// TestHandleLeaseSurvivesOtherDescriptors checks that only the release of the locked open
// file ends a flock handle lease: closing a second open of the file or a dup does not, and a
// child that inherits the descriptor across fork keeps the lease after the parent exits.
func TestHandleLeaseSurvivesOtherDescriptors(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "multi")
	holder := startPy(t, `
import fcntl, signal
p = os.environ["P"]
fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
out("held", os.getpid())
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "reopen":
        fd2 = os.open(p, os.O_RDONLY)
        os.close(fd2)
        out("reopen", "done")
    elif cmd == "dup":
        os.close(os.dup(fd))
        out("dup", "done")
    elif cmd == "fork":
        pid = os.fork()
        if pid == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for i in (0, 1, 2):
                os.dup2(null, i)
            while True:
                signal.pause()
        out("child", pid)
        os._exit(0)
`, "P="+p)
	holder.expectKey("held", holdTimeout)
	st0, _ := statusDoc(t, p)
	wantHandle(t, st0, "multi")

	stillHeld := func(after string) {
		t.Helper()
		if r := sh(t, `flock -n "$P" true`, "P="+p); r.code != 1 {
			t.Errorf("after %s: flock -n from bash: %s\nwant exit 1 (still held)", after, r)
		}
		r := sh(t, `cat "$P"`, "P="+p)
		if r.code != 0 {
			t.Fatalf("after %s the lease is gone: %s\ndaemon stderr:\n%s", after, r, d.stderr())
		}
		if st := parseStatus(t, r.stdout); st["lease_id"] != st0["lease_id"] || st["status"] != "active" {
			t.Errorf("after %s the lease is %v, want %s active", after, st, st0["lease_id"])
		}
	}
	holder.send("reopen")
	holder.expectKey("reopen", holdTimeout)
	stillHeld("the holder opened and closed a second descriptor")
	holder.send("dup")
	holder.expectKey("dup", holdTimeout)
	stillHeld("the holder closed a dup of the locked descriptor")
	holder.send("fork")
	child, err := strconv.Atoi(holder.expectKey("child", holdTimeout))
	if err != nil {
		t.Fatalf("child pid: %v", err)
	}
	holder.wait(10 * time.Second)
	stillHeld("the parent exited, leaving the descriptor to its child")

	_ = syscall.Kill(child, syscall.SIGKILL)
	waitGone(t, d.mountpoint, "multi", "the lease ends when the child holding the descriptor dies")
	wantHistory(t, d.state, "multi", st0["lease_id"], "complete")
}

// TestFlockUnlock checks that LOCK_UN ends the lease at once (the descriptor then answers
// ESTALE) and that flock on the same descriptor afterwards acquires the name again, re-binding
// the open file to the new lease.
func TestFlockUnlock(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "unlocked")
	kv := pyKV(t, `
import fcntl, subprocess
p = os.environ["P"]
cat = lambda: subprocess.run(["cat", p], capture_output=True, text=True).stdout
fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
out("status1", cat())
fcntl.flock(fd, fcntl.LOCK_UN)
out("stat_after_unlock", err(os.stat, p))
out("read_after_unlock", err(os.pread, fd, 4096, 0))
out("relock", err(fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
data, res = call(os.pread, fd, 4096, 0)
out("read_after_relock", res)
out("status2", data)
`, "P="+p)
	st1 := parseStatus(t, kv["status1"])
	wantHandle(t, st1, "unlocked")
	wantKV(t, kv, "stat_after_unlock", "ENOENT")
	wantKV(t, kv, "read_after_unlock", "ESTALE")
	wantKV(t, kv, "relock", "ok")
	wantKV(t, kv, "read_after_relock", "ok")
	st2 := parseStatus(t, kv["status2"])
	wantHandle(t, st2, "unlocked")
	if st2["lease_id"] == st1["lease_id"] {
		t.Errorf("flock after LOCK_UN kept lease %s, want a new lease", st1["lease_id"])
	}
	wantHistory(t, d.state, "unlocked", st1["lease_id"], "complete")
	waitGone(t, d.mountpoint, "unlocked", "the second lease ends with the open file")
	wantHistory(t, d.state, "unlocked", st2["lease_id"], "complete")
}

// TestUnlinkRacesWaiter has the holder's uid unlink a flock-held name while a waiter is
// blocked on it, and a third process create it with O_EXCL right after: exactly one of the
// waiter and the creator holds the name. Three rounds, each on a fresh name.
func TestUnlinkRacesWaiter(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	for round := range 3 {
		name := fmt.Sprintf("r%d", round)
		p := filepath.Join(d.mountpoint, name)
		holder := startPy(t, pyFlockHolder, "P="+p)
		holder.expectKey("held", holdTimeout)
		st0, _ := statusDoc(t, p)
		waiter := startPy(t, `
import fcntl
fd = os.open(os.environ["P"], os.O_RDWR)
out("waiting", os.getpid())
fcntl.flock(fd, fcntl.LOCK_EX)
out("got", os.getpid())
data, res = call(os.pread, fd, 4096, 0)
out("read", data if res == "ok" else res)
sys.stdin.read()
`, "P="+p)
		waiter.expectKey("waiting", holdTimeout)
		waitWaiters(t, p, 1)

		r := mustSh(t, `rm "$P" || exit 9; set -C; : > "$P"; echo "create=$? pid=$$"`, "P="+p)
		var created, creator int
		if _, err := fmt.Sscanf(strings.TrimSpace(r.stdout), "create=%d pid=%d", &created, &creator); err != nil {
			t.Fatalf("round %d: unlink and create: %s", round, r)
		}
		wantHistory(t, d.state, name, st0["lease_id"], "complete")
		switch created {
		case 0: // the creator won; the waiter must still be waiting
			live := liveLeases(t, d.state, name)
			if len(live) != 1 || fmt.Sprint(live[0]["mode"]) != "token" || fmt.Sprint(live[0]["holder_pid"]) != strconv.Itoa(creator) {
				t.Errorf("round %d: creator %d won, live leases %v, want its token lease only", round, creator, live)
			}
			readToken(t, p)
			waitWaiters(t, p, 1)
			if strings.Contains(waiter.stdout.String(), `"got"`) {
				t.Errorf("round %d: both the creator and the waiter hold %s", round, name)
			}
			mustSh(t, `rm "$P"`, "P="+p)
			waiter.expectKey("got", holdTimeout)
		case 1: // the waiter won
			waiter.expectKey("got", holdTimeout)
		default:
			t.Fatalf("round %d: create: %s", round, r)
		}
		live := liveLeases(t, d.state, name)
		if len(live) != 1 || fmt.Sprint(live[0]["mode"]) != "handle" || fmt.Sprint(live[0]["holder_pid"]) != strconv.Itoa(waiter.pid) {
			t.Errorf("round %d (creator exit %d): live leases %v, want the waiter %d's handle lease only",
				round, created, live, waiter.pid)
		}
		// The waiter's descriptor, opened on the unlinked lease, is re-bound to the lease its
		// flock was granted: it reads that lease's status document.
		if st := parseStatus(t, waiter.expectKey("read", holdTimeout)); len(live) == 1 && st["lease_id"] != fmt.Sprint(live[0]["lease_id"]) {
			t.Errorf("round %d: the waiter's descriptor reads %v, want the granted lease %v", round, st, live[0]["lease_id"])
		}
		t.Logf("round %d: %s", round, map[int]string{0: "the creator won", 1: "the waiter won"}[created])
	}
}

// TestLockRefusals checks the locks leasefs cannot honour exactly: shared flock and fcntl
// locks and byte-range fcntl locks get ENOLCK, and a refused lock binds nothing (the lease
// stays a token lease whose token is still unread).
// A refused lock leaves nothing held: the lease the refused open file
// reserved ends before the refusal returns, unless its token was read.
func TestLockRefusals(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "excl")
	kv := pyKV(t, `
import fcntl, struct, subprocess
p = os.environ["P"]
locks = {
    "flock_sh": lambda fd: fcntl.flock(fd, fcntl.LOCK_SH),
    "flock_sh_nb": lambda fd: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB),
    "lockf_sh": lambda fd: fcntl.lockf(fd, fcntl.LOCK_SH),
    "fcntl_rdlck": lambda fd: fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0)),
    "lockf_len10": lambda fd: fcntl.lockf(fd, fcntl.LOCK_EX, 10),
    "lockf_from5": lambda fd: fcntl.lockf(fd, fcntl.LOCK_EX, 0, 5),
}
for name, lock in locks.items():
    fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    out(name, err(lock, fd))
    out(name + "_after", err(os.stat, p))
    out(name + "_renew", err(os.write, fd, b"takeover"))
    os.close(fd)
# With its token read, the reservation is the holder's: a refused lock keeps it.
fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
out("token", os.read(fd, 4096))
out("read_then_sh", err(fcntl.flock, fd, fcntl.LOCK_SH))
out("read_then_after", err(os.stat, p))
os.close(fd)
`, "P="+p)
	for _, k := range []string{"flock_sh", "flock_sh_nb", "lockf_sh", "fcntl_rdlck", "lockf_len10", "lockf_from5"} {
		wantKV(t, kv, k, "ENOLCK")
		wantKV(t, kv, k+"_after", "ENOENT")
		wantKV(t, kv, k+"_renew", "ESTALE")
	}
	wantKV(t, kv, "read_then_sh", "ENOLCK")
	wantKV(t, kv, "read_then_after", "ok")
	if !tokenRE.MatchString(strings.TrimSpace(kv["token"]) + "\n") {
		t.Errorf("first read = %q, want the token", kv["token"])
	}
	st, _ := statusDoc(t, p)
	if st["mode"] != "token" {
		t.Errorf("after a refused lock on a claimed reservation mode = %q, want token", st["mode"])
	}
	hist := cliJSON(t, "history", "--state", d.state, "excl", "--json")
	if len(hist) != 6 {
		t.Fatalf("history of excl has %d leases, want the 6 refused reservations: %v", len(hist), hist)
	}
	for _, h := range hist {
		if h["status"] != "abandoned" {
			t.Errorf("refused reservation ended as %v, want abandoned: %v", h["status"], h)
		}
	}
}

// flock(1) with a shared lock on a free name: the O_CREAT open reserved
// the name, the lock is refused, and the name is free again at once.
func TestFlockSharedRefusedFreesName(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "x")
	r := sh(t, `flock -s -n "$P" true`, "P="+p)
	if r.code == 0 {
		t.Fatalf("flock -s succeeded: %s", r)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after a refused flock -s the name is still held: stat = %v", err)
	}
	mustSh(t, `set -C; : > "$P"`, "P="+p) // free to reserve at once
}

// pyPosixHolder is a python3 client that reserves $P and takes a whole-file lockf(LOCK_EX)
// write lock, reports out("held", pid) and then answers commands on stdin: "getlk" reports its
// own F_GETLK, "close-other" opens and closes a second descriptor of the file.
const pyPosixHolder = `
import fcntl, struct
p = os.environ["P"]
fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX)
out("held", os.getpid())
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "getlk":
        r = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
        out("getlk", " ".join(map(str, struct.unpack("hhqqi", r))))
    elif cmd == "close-other":
        os.close(os.open(p, os.O_RDONLY))
        out("closed", err(os.stat, p))
`

// pyProbeLock is a python3 client that opens $P and reports a non-blocking lockf and F_GETLK
// (type whence start len pid).
const pyProbeLock = `
import fcntl, struct
fd = os.open(os.environ["P"], os.O_RDWR)
out("lockf_nb", err(fcntl.lockf, fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
r = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))
out("getlk", " ".join(map(str, struct.unpack("hhqqi", r))))
`

// wantGetlk checks an F_GETLK answer "type whence start len pid": a whole-file write lock by
// pid, or no lock when pid is 0.
func wantGetlk(t *testing.T, what, got string, pid int) {
	t.Helper()
	want := fmt.Sprintf("%d 0 0 0 %d", syscall.F_WRLCK, pid)
	if pid == 0 {
		want = fmt.Sprintf("%d 0 0 0 0", syscall.F_UNLCK)
	}
	if got != want {
		t.Errorf("%s: F_GETLK = %q (type whence start len pid), want %q", what, got, want)
	}
}

// TestPosixLockHandleLease checks whole-file POSIX locks (python fcntl.lockf): the reserving
// descriptor's lock makes a handle lease; another process's non-blocking lockf is refused and
// its F_GETLK names the holder's pid; the lease ends when the holder is SIGKILLed or exits.
//
// As with any POSIX lock, the lock belongs to the process and the file, not to the
// descriptor: closing ANY descriptor of the file in the locking process releases the lock
// (POSIX.1 fcntl), and with it the lease. The holders here therefore never read the lease
// file through a second descriptor of their own.
func TestPosixLockHandleLease(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "posix")

	holder := startPy(t, pyPosixHolder, "P="+p)
	holder.expectKey("held", holdTimeout)
	st, _ := statusDoc(t, p)
	wantHandle(t, st, "posix")
	if st["holder_pid"] != strconv.Itoa(holder.pid) {
		t.Errorf("holder_pid = %q, want the locking process %d", st["holder_pid"], holder.pid)
	}
	probe := pyKV(t, pyProbeLock, "P="+p)
	if v := probe["lockf_nb"]; v != "EAGAIN" && v != "EACCES" {
		t.Errorf("lockf(LOCK_EX|LOCK_NB) by another process = %q, want EAGAIN or EACCES", v)
	}
	wantGetlk(t, "another process", probe["getlk"], holder.pid)
	holder.send("getlk")
	wantGetlk(t, "the holder itself", holder.expectKey("getlk", holdTimeout), 0)
	if r := sh(t, `flock -n "$P" true`, "P="+p); r.code != 1 {
		t.Errorf("flock -n on a lockf-held lease: %s\nwant exit 1", r)
	}

	// SIGKILL: the kernel closes the holder's descriptors, which releases its POSIX lock.
	holder.killGroup()
	holder.wait(10 * time.Second)
	kv := pyKV(t, `
import fcntl, signal, subprocess
signal.alarm(20)  # a lost wake-up fails instead of hanging
p = os.environ["P"]
fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX)  # F_SETLKW: waits if the killed holder's lease is still live
out("pid", os.getpid())
out("status", subprocess.run(["cat", p], capture_output=True, text=True).stdout)
# POSIX: closing another descriptor of the file releases this process's lock, and the lease.
os.close(os.open(p, os.O_RDONLY))
out("stat_after_close", err(os.stat, p))
out("read_after_close", err(os.pread, fd, 4096, 0))
`, "P="+p)
	st2 := parseStatus(t, kv["status"])
	wantHandle(t, st2, "posix")
	if st2["holder_pid"] != kv["pid"] || st2["lease_id"] == st["lease_id"] {
		t.Errorf("successor's lease %v, want a new lease held by %s", st2, kv["pid"])
	}
	wantKV(t, kv, "stat_after_close", "ENOENT")
	wantKV(t, kv, "read_after_close", "ESTALE")
	wantHistory(t, d.state, "posix", st["lease_id"], "complete")
	wantHistory(t, d.state, "posix", st2["lease_id"], "complete")

	// A holder that exits normally: its exit closes the descriptor before it is reaped.
	kv = pyKV(t, `
import fcntl
fd = os.open(os.environ["P"], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX)
out("locked", "ok")
`, "P="+p)
	wantKV(t, kv, "locked", "ok")
	if names := listMount(t, d.mountpoint); slices.Contains(names, "posix") {
		t.Errorf("after the lockf holder exited the mount still lists posix: %v", names)
	}

	// The holder closing a second descriptor of its own ends the lease the same way.
	holder = startPy(t, pyPosixHolder, "P="+p)
	holder.expectKey("held", holdTimeout)
	holder.send("close-other")
	if got := holder.expectKey("closed", holdTimeout); got != "ENOENT" {
		t.Errorf("stat after the lockf holder closed another descriptor of the file = %s, want ENOENT (lock and lease released)", got)
	}
}

// TestPosixLockGrantedAfterWaitEndsOnAnyClose: a process opens a held name, waits in
// lockf(F_SETLKW) and is granted the new lease, which its descriptor reaches through the
// inode of the lease it waited for, while a later open of the name finds the new lease's
// inode. POSIX locks belong to the process and the file, and the file is the name: closing
// that later descriptor releases the lock and ends the lease (POSIX.1 fcntl,
// docs/PROTOCOL.md §6).
func TestPosixLockGrantedAfterWaitEndsOnAnyClose(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "posix-wait")
	holder := startPy(t, pyPosixHolder, "P="+p)
	holder.expectKey("held", holdTimeout)
	st, _ := statusDoc(t, p)
	waiter := startPy(t, `
import fcntl, signal
signal.alarm(20)  # a lost wake-up fails instead of hanging
p = os.environ["P"]
fd = os.open(p, os.O_RDWR)  # the holder's lease: its inode
out("ino", os.fstat(fd).st_ino)
fcntl.lockf(fd, fcntl.LOCK_EX)  # waits for the holder
out("locked", os.getpid())
sys.stdin.readline()
fd2 = os.open(p, os.O_RDONLY)
out("ino2", os.fstat(fd2).st_ino)
os.close(fd2)
out("stat_after_close", err(os.stat, p))
out("read_after_close", err(os.pread, fd, 4096, 0))
sys.stdin.read()
`, "P="+p)
	waiter.expectKey("ino", holdTimeout)
	holder.killGroup()
	holder.wait(10 * time.Second)
	pid := waiter.expectKey("locked", holdTimeout)
	st2, _ := statusDoc(t, p)
	wantHandle(t, st2, "posix-wait")
	if st2["holder_pid"] != pid || st2["lease_id"] == st["lease_id"] {
		t.Fatalf("after the wait: lease %v, want a new lease held by the waiter %s", st2, pid)
	}
	waiter.send("")
	if ino, ino2 := waiter.expectKey("ino", holdTimeout), waiter.expectKey("ino2", holdTimeout); ino == ino2 {
		t.Fatalf("the second descriptor shows the inode %s of the first: the case under test did not arise", ino)
	}
	if got := waiter.expectKey("stat_after_close", holdTimeout); got != "ENOENT" {
		t.Errorf("stat after the waiter closed a later descriptor of the name = %s, want ENOENT (lock and lease released)", got)
	}
	if got := waiter.expectKey("read_after_close", holdTimeout); got != "ESTALE" {
		t.Errorf("read of the locking descriptor after the release = %s, want ESTALE", got)
	}
	wantHistory(t, d.state, "posix-wait", st["lease_id"], "complete")
	wantHistory(t, d.state, "posix-wait", st2["lease_id"], "complete")
}

// TestPosixLockOnTokenLease binds a token lease, reserved by a shell, with lockf from another
// process that presents the token: the lease becomes a handle lease, and F_GETLK from a third
// process reports the locking process (docs/PROTOCOL.md §6: "fcntl(F_GETLK) reports the holder's pid").
func TestPosixLockOnTokenLease(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "posix-token")
	tok := reserve(t, p)
	st0, _ := statusDoc(t, p)
	holder := startPy(t, `
import fcntl
fd = os.open(os.environ["P"], os.O_RDWR)
os.write(fd, (os.environ["TOK"] + "\n").encode())
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
out("held", os.getpid())
sys.stdin.read()
`, "P="+p, "TOK="+tok)
	holder.expectKey("held", holdTimeout)
	st, _ := statusDoc(t, p)
	wantHandle(t, st, "posix-token")
	if st["lease_id"] != st0["lease_id"] {
		t.Errorf("lockf after the token bound lease %s, want the token lease %s", st["lease_id"], st0["lease_id"])
	}
	probe := pyKV(t, pyProbeLock, "P="+p)
	if v := probe["lockf_nb"]; v != "EAGAIN" && v != "EACCES" {
		t.Errorf("lockf(LOCK_EX|LOCK_NB) by another process = %q, want EAGAIN or EACCES", v)
	}
	wantGetlk(t, "another process, lease bound by a process other than its reserver", probe["getlk"], holder.pid)
	holder.killGroup()
	waitGone(t, d.mountpoint, "posix-token", "the bound token lease ends with its lockf holder")
	wantHistory(t, d.state, "posix-token", st0["lease_id"], "complete")
}

// TestFlockInterrupted interrupts a blocked flock waiter with a signal: flock(2) fails with
// EINTR and nothing is reserved or queued for it; the holder keeps its lease.
func TestFlockInterrupted(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "intr")
	holder := startPy(t, pyFlockHolder, "P="+p)
	holder.expectKey("held", holdTimeout)
	st0, _ := statusDoc(t, p)

	// libc flock through ctypes, so that EINTR is seen as such (Python's own fcntl.flock
	// retries on EINTR after running a handler that returns).
	waiter := startPy(t, `
import ctypes, fcntl, signal, time
libc = ctypes.CDLL(None, use_errno=True)
signal.signal(signal.SIGUSR1, lambda *_: None)
fd = os.open(os.environ["P"], os.O_RDONLY)
out("waiting", os.getpid())
t0 = time.monotonic()
rc = libc.flock(fd, fcntl.LOCK_EX)
e = ctypes.get_errno()
out("rc", rc)
out("errno", errno.errorcode.get(e, e) if rc else "none")
out("nb", err(fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
out("done", "1")
`, "P="+p)
	waiter.expectKey("waiting", holdTimeout)
	waitWaiters(t, p, 1)
	waiter.signal(syscall.SIGUSR1)
	waiter.expectKey("done", holdTimeout)
	waiter.wait(10 * time.Second)
	kv := waiter.kv()
	wantKV(t, kv, "rc", "-1")
	wantKV(t, kv, "errno", "EINTR")
	if v := kv["nb"]; v != "EAGAIN" && v != "EWOULDBLOCK" {
		t.Errorf("non-blocking flock after the interrupted wait = %q, want EWOULDBLOCK", v)
	}
	st, _ := statusDoc(t, p)
	if st["lease_id"] != st0["lease_id"] || st["holder_pid"] != strconv.Itoa(holder.pid) {
		t.Errorf("after the interrupted wait the lease is %v, want %s held by %d", st, st0["lease_id"], holder.pid)
	}
	if w, ok := st["waiters"]; ok && w != "0" {
		t.Errorf("after the interrupted wait waiters = %s, want 0", w)
	}
	if live := liveLeases(t, d.state, "intr"); len(live) != 1 {
		t.Errorf("live leases on intr: %v, want only the holder's", live)
	}
	if h := cliJSON(t, "history", "--state", d.state, "intr", "--json"); len(h) != 0 {
		t.Errorf("history of intr: %v, want none (the interrupted waiter reserved nothing)", h)
	}
}

// TestHandleLeaseNeverExpires runs a daemon with a 2 s lease duration and checks, against a
// token lease reserved after them as the clock, that handle leases (one reserved by
// flock, one a token lease bound by presenting its token) outlive the duration, and that a
// flock waiter blocked on the expiring token lease is granted the name when it expires.
func TestHandleLeaseNeverExpires(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{leaseDuration: 2 * time.Second})
	clock := filepath.Join(d.mountpoint, "clock")
	bound := filepath.Join(d.mountpoint, "bound")
	tok := reserve(t, bound)

	flocked := startPy(t, pyFlockHolder, "P="+filepath.Join(d.mountpoint, "flocked"))
	flocked.expectKey("held", holdTimeout)
	binder := startPy(t, `
import fcntl
fd = os.open(os.environ["P"], os.O_RDWR)
os.write(fd, (os.environ["TOK"] + "\n").encode())
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
out("held", os.getpid())
sys.stdin.read()
`, "P="+bound, "TOK="+tok)
	binder.expectKey("held", holdTimeout)
	reserve(t, clock) // reserved after the handle leases' last heartbeats
	waiter := startPy(t, pySuccessor, "P="+clock)
	waiter.expectKey("waiting", holdTimeout)

	// The clock lease expires (nobody renews it); the waiter gets the name.
	waiter.expectKey("got", 10*time.Second)
	for _, name := range []string{"flocked", "bound", "clock"} {
		st, _ := statusDoc(t, filepath.Join(d.mountpoint, name))
		wantHandle(t, st, name)
	}
	if st, _ := statusDoc(t, filepath.Join(d.mountpoint, "clock")); st["holder_pid"] != strconv.Itoa(waiter.pid) {
		t.Errorf("clock after expiry: %v, want the waiter %d's handle lease", st, waiter.pid)
	}
}

// TestFlockOtherUID checks handle leases across uids with --allow-other: nobody's flock -n on
// root's handle lease is refused, nobody's blocking flock (on a descriptor opened read-only on
// root's lease) is granted the name when root's holder dies, as a lease held by uid 65534, and
// root's flock -n is then refused.
func TestFlockOtherUID(t *testing.T) {
	t.Parallel()
	d := startSharedDaemon(t)
	setpriv := requireTool(t, "setpriv")
	p := filepath.Join(d.mountpoint, "shared")
	holder := startPy(t, pyFlockHolder, "P="+p)
	holder.expectKey("held", holdTimeout)

	kv := pyAsNobody(t, `
import fcntl
fd = os.open(os.environ["P"], os.O_RDONLY)
out("nb", err(fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
`, "P="+p)
	if v := kv["nb"]; v != "EAGAIN" && v != "EWOULDBLOCK" {
		t.Errorf("nobody's flock -n on root's handle lease = %q, want EWOULDBLOCK", v)
	}
	waiter := startProc(t, []string{"P=" + p}, setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups",
		otherPython(t), "-u", "-c", pyPrelude+`
import fcntl
fd = os.open(os.environ["P"], os.O_RDONLY)
out("waiting", os.getpid())
fcntl.flock(fd, fcntl.LOCK_EX)
out("got", os.getpid())
sys.stdin.read()
`)
	waiter.expectKey("waiting", holdTimeout)
	waitWaiters(t, p, 1)
	holder.killGroup()
	waiter.expectKey("got", holdTimeout)
	st, _ := statusDoc(t, p)
	wantHandle(t, st, "shared")
	if st["holder_uid"] != "65534" || st["holder_pid"] != strconv.Itoa(waiter.pid) {
		t.Errorf("lease granted to nobody's waiter: %v, want holder_uid 65534, holder_pid %d", st, waiter.pid)
	}
	if r := sh(t, `flock -n "$P" true`, "P="+p); r.code != 1 {
		t.Errorf("root's flock -n on nobody's handle lease: %s\nwant exit 1", r)
	}
	waiter.killGroup()
	waitGone(t, d.mountpoint, "shared", "nobody's handle lease ends with its holder")
}

// TestGrantedWaiterDescriptor checks the descriptor of a blocked flock waiter once it is
// granted the name: docs/PROTOCOL.md §6 re-binds that open file to the granted lease, so it reads the new
// lease's status document, and fstat and fgetxattr on it describe the new lease. Its st_ino
// stays the inode it was opened on (the kernel keeps an open file's inode; every lease has an
// inode of its own), as documented in docs/OPERATIONS.md ("Handle leases in detail").
func TestGrantedWaiterDescriptor(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "granted")
	holder := startPy(t, pyFlockHolder, "P="+p)
	holder.expectKey("held", holdTimeout)
	st0, _ := statusDoc(t, p)
	waiter := startPy(t, `
import fcntl
p = os.environ["P"]
fd = os.open(p, os.O_RDONLY)
out("ino_before", os.fstat(fd).st_ino)
out("waiting", os.getpid())
fcntl.flock(fd, fcntl.LOCK_EX)
st, res = call(os.fstat, fd)
out("fstat", res)
out("fstat_ino", st.st_ino if st else "")
out("stat_ino", os.stat(p).st_ino)
v, res = call(os.getxattr, fd, "user.lease.lease_id")
out("fgetxattr", v if res == "ok" else res)
v, res = call(os.pread, fd, 4096, 0)
out("read", v if res == "ok" else res)
out("done", "1")
sys.stdin.read()
`, "P="+p)
	waiter.expectKey("waiting", holdTimeout)
	waitWaiters(t, p, 1)
	holder.killGroup()
	waiter.expectKey("done", holdTimeout)
	got := waiter.kv()
	st := parseStatus(t, got["read"])
	wantHandle(t, st, "granted")
	if st["lease_id"] == st0["lease_id"] || st["holder_pid"] != strconv.Itoa(waiter.pid) {
		t.Errorf("the granted waiter's descriptor reads %v, want a new lease held by %d", st, waiter.pid)
	}
	if got["fstat"] != "ok" || got["fstat_ino"] != got["ino_before"] || got["stat_ino"] == got["ino_before"] {
		t.Errorf("fstat on the granted waiter's descriptor: %s, st_ino %q; stat(path).st_ino %s (before the grant %s): want ok, the opened inode, and a new inode on the path",
			got["fstat"], got["fstat_ino"], got["stat_ino"], got["ino_before"])
	}
	if got["fgetxattr"] != st["lease_id"] {
		t.Errorf("fgetxattr user.lease.lease_id on the granted waiter's descriptor = %q, want %s", got["fgetxattr"], st["lease_id"])
	}
}

// TestOFDLock checks open file description locks (fcntl F_OFD_SETLK, Linux): they belong to
// the open file, not to the process, so a handle lease made by one must end when that open
// file is closed (docs/PROTOCOL.md §6: never a lock the daemon cannot honour exactly); refusing them with
// ENOLCK is the alternative the spec allows.
func TestOFDLock(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "ofd")
	kv := pyKV(t, `
import fcntl, struct, subprocess
p = os.environ["P"]
fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
out("ofd", err(fcntl.fcntl, fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0)))
out("status", subprocess.run(["cat", p], capture_output=True, text=True).stdout)
os.close(fd)
`, "P="+p)
	switch kv["ofd"] {
	case "ENOLCK":
		t.Logf("F_OFD_SETLK refused with ENOLCK")
		return
	case "ok":
	default:
		t.Fatalf("F_OFD_SETLK = %s, want ok or ENOLCK", kv["ofd"])
	}
	st := parseStatus(t, kv["status"])
	wantHandle(t, st, "ofd")
	eventually(t, 5*time.Second, "the OFD-locked lease ends once its open file is closed and its process has exited", func() (bool, string) {
		live := liveLeases(t, d.state, "ofd")
		return len(live) == 0, fmt.Sprint(live)
	})
	wantHistory(t, d.state, "ofd", st["lease_id"], "complete")
}

// A refused write through the reserving descriptor of a name it has since
// locked leaves the handle lease alone: only an unclaimed token lease is
// released by a refused call (docs/PROTOCOL.md §3, "Choices").
func TestRefusedWriteKeepsLockedReservation(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	kv := pyKV(t, `
import fcntl
p = os.path.join(M, "locked")
fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
out("write", err(os.write, fd, b'action = "explode"'))
out("mode", os.getxattr(p, "user.lease.mode").decode())
out("read", err(os.pread, fd, 4096, 0))
`, "M="+d.mountpoint)
	wantKV(t, kv, "write", "EINVAL")
	wantKV(t, kv, "mode", "handle")
	wantKV(t, kv, "read", "ok")
}
