package integration

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Daemon handover (`leasefs mount --takeover`, docs/PROTOCOL.md §2).

// mountResult is the outcome of a `leasefs mount` that is expected to give up.
type mountResult struct {
	code   int
	stderr string
	took   time.Duration
}

// runFailingMount runs `leasefs ARGS...` expecting it to exit by itself within timeout (it is
// SIGTERMed and the test fails otherwise). Cleanup detaches mp in case it mounted after all.
func runFailingMount(t *testing.T, timeout time.Duration, mp string, args ...string) mountResult {
	t.Helper()
	before := mountCount(t, mp)
	t.Cleanup(func() {
		if mountCount(t, mp) > before {
			detach(t, mp)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	argv := withStore(append([]string{leasefsBin}, args...))
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = "/"
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	_ = cmd.Run()
	r := mountResult{code: cmd.ProcessState.ExitCode(), stderr: stderr.String(), took: time.Since(start)}
	if ctx.Err() != nil {
		t.Fatalf("leasefs %q still running after %v; stderr:\n%s", args, timeout, r.stderr)
	}
	return r
}

// TestHandover starts daemon B with --takeover on daemon A's state and mountpoint while A
// serves a token lease and a flock handle lease: B mounts, A exits 0 within a few seconds, the
// token still renews through B, the handle lease lives on while its holder keeps the open file
// (whose descriptor answers ENOTCONN, the daemon it was opened through being gone) and ends
// once the holder closes it, and a further daemon without --takeover is refused with exit 3.
func TestHandover(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	a := startDaemon(t, daemonOpts{})
	tp := filepath.Join(a.mountpoint, "token-lease")
	tok := reserve(t, tp)
	tst, _ := statusDoc(t, tp)

	hp := filepath.Join(a.mountpoint, "handle-lease")
	holder := startPy(t, `
import fcntl
fd = os.open(os.environ["P"], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
out("held", os.getpid())
for line in sys.stdin:
    out(line.strip(), err(os.pread, fd, 4096, 0))
`, "P="+hp)
	holder.expectKey("held", holdTimeout)
	hst, _ := statusDoc(t, hp)
	wantHandle(t, hst, "handle-lease")
	holder.send("read-before")
	if got := holder.expectKey("read-before", holdTimeout); got != "ok" {
		t.Fatalf("holder's read before the handover: %s", got)
	}

	start := time.Now()
	b := startDaemon(t, daemonOpts{mountpoint: a.mountpoint, state: a.state, takeover: true})
	t.Logf("B mounted %v after it started", time.Since(start).Round(time.Millisecond))
	holder.send("read-after-handover")
	afterHandover := holder.expectKey("read-after-handover", holdTimeout)

	code, exited := a.waitExit(15 * time.Second)
	switch {
	case !exited:
		t.Errorf("daemon A still running 15s after B started; A's stderr:\n%s", a.stderr())
	case code != 0:
		t.Errorf("daemon A exited with code %d after handing over, want 0; stderr:\n%s", code, a.stderr())
	default:
		t.Logf("A exited %v after B started", time.Since(start).Round(time.Millisecond))
	}
	if !strings.Contains(a.stderr(), "handing over") {
		t.Errorf("daemon A did not log the handover; stderr:\n%s", a.stderr())
	}
	holder.send("read-after-exit")
	afterExit := holder.expectKey("read-after-exit", holdTimeout)
	// A answers ENOTCONN for the lease that outlives it once its store is closed, and the
	// kernel does once A has exited (docs/PROTOCOL.md §2): never ESTALE, which says the
	// lease ended.
	if afterHandover != "ENOTCONN" || afterExit != "ENOTCONN" {
		t.Errorf("the handle lease holder's read on its descriptor after the handover = %s (B mounted), %s (A exited); want ENOTCONN both times",
			afterHandover, afterExit)
	}

	if r := sh(t, `echo "$TOK" >| "$P"`, "P="+tp, "TOK="+tok); r.code != 0 {
		t.Errorf("renew of the token lease through B: %s\nB's stderr:\n%s", r, b.stderr())
	}
	if st, _ := statusDoc(t, tp); st["lease_id"] != tst["lease_id"] || st["status"] != "active" || st["mode"] != "token" {
		t.Errorf("token lease through B: %v, want %s active", st, tst["lease_id"])
	}
	if st, _ := statusDoc(t, hp); st["lease_id"] != hst["lease_id"] || st["status"] != "active" || st["daemon"] != "previous" {
		t.Errorf("the handle lease through B: %v, want %s active, daemon = previous", st, hst["lease_id"])
	}
	if r := sh(t, `flock -n "$P" true`, "P="+hp); r.code == 0 {
		t.Errorf("flock -n through B on the name A's holder still holds was granted")
	}
	holder.stdin.Close()
	holder.wait(holdTimeout)
	eventually(t, survivorGrant, "the name free once A's holder closed its open file", func() (bool, string) {
		r := sh(t, `flock -n "$P" true`, "P="+hp)
		return r.code == 0, r.String()
	})
	wantHistory(t, a.state, "handle-lease", hst["lease_id"], "complete")

	// Without --takeover a further daemon is still refused, naming B.
	mp3 := t.TempDir()
	r := runFailingMount(t, 10*time.Second, mp3, "mount", "--state", a.state, mp3)
	if r.code != 3 {
		t.Errorf("a daemon without --takeover on B's state: exit code %d, want 3; stderr:\n%s", r.code, r.stderr)
	}
	if !regexp.MustCompile(`\bpid ` + strconv.Itoa(b.pid) + `\b`).MatchString(r.stderr) {
		t.Errorf("the refused daemon's message does not name B (pid %d):\n%s", b.pid, r.stderr)
	}
	if !b.running() {
		t.Errorf("B exited; stderr:\n%s", b.stderr())
	}
}

// TestHandoverTimeout asks a stopped daemon (SIGSTOP) to hand over with --takeover-timeout 1s:
// the new daemon gives up with a non-zero exit and a message naming the holder's pid, and the
// old daemon, once continued, keeps serving (the void request does not make it hand over).
func TestHandoverTimeout(t *testing.T) {
	t.Parallel()
	a := startDaemon(t, daemonOpts{})
	p := filepath.Join(a.mountpoint, "kept")
	tok := reserve(t, p)

	if err := syscall.Kill(a.pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP daemon: %v", err)
	}
	// Registered after startDaemon's cleanup, so it runs first.
	t.Cleanup(func() { _ = syscall.Kill(a.pid, syscall.SIGCONT) })
	r := runFailingMount(t, 20*time.Second, a.mountpoint,
		"mount", "--takeover", "--takeover-timeout", "1s", "--state", a.state, a.mountpoint)
	if err := syscall.Kill(a.pid, syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT daemon: %v", err)
	}
	if r.code == 0 {
		t.Errorf("--takeover against a stopped daemon exited 0, want a failure; stderr:\n%s", r.stderr)
	}
	if !regexp.MustCompile(`\bpid ` + strconv.Itoa(a.pid) + `\b`).MatchString(r.stderr) {
		t.Errorf("--takeover's failure does not name the holder's pid %d:\n%s", a.pid, r.stderr)
	}
	if r.took < time.Second || r.took > 8*time.Second {
		t.Errorf("--takeover-timeout 1s gave up after %v", r.took)
	}
	t.Logf("gave up after %v with exit %d: %s", r.took.Round(time.Millisecond), r.code, strings.TrimSpace(r.stderr))

	// The daemon polls for takeover requests every 100 ms: watch it for 1 s.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if !a.running() || strings.Contains(a.stderr(), "handing over") {
			t.Fatalf("the continued daemon handed over to a requester that gave up; stderr:\n%s", a.stderr())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r := sh(t, `echo "$TOK" >| "$P"`, "P="+p, "TOK="+tok); r.code != 0 {
		t.Errorf("renew through the continued daemon: %s\nstderr:\n%s", r, a.stderr())
	}
	a.stop(true)
}
