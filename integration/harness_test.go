package integration

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/internal/testenv"
	"github.com/leasefs/leasefs/mount"
)

// leasefsBin is the path of the binary built by TestMain; it is set once before any test runs.
var leasefsBin string

// clientTimeout bounds every client process a test runs.
const clientTimeout = 30 * time.Second

// tokenRE matches exactly what the first read of a fresh lease returns.
var tokenRE = regexp.MustCompile(`^hwl_[a-z2-7]{39}\n$`)

// leaseIDRE matches a lease id.
var leaseIDRE = regexp.MustCompile(`^lease-[a-z2-7]{39}$`)

// mountedRE matches the daemon's readiness log line.
var mountedRE = regexp.MustCompile(`(?m)(^|\s)msg=mounted(\s|$)`)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

// runMain builds the binary into a temporary directory, runs the tests and removes the
// directory; it returns the process exit code. The binary is built with -race when the tests
// are, so that a data race in the daemon fails the test that ran it (see [raceReports]).
func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "leasefs-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	// Tests run the binary as other uids too.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	leasefsBin = filepath.Join(dir, "leasefs")
	args := []string{"build", "-o", leasefsBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "integration: go build in %s: %v\n%s", root, err, out)
		return 1
	}
	stopStore, err := startTestStore(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		return 1
	}
	defer stopStore()
	start := time.Now()
	code := m.Run()
	if err := writeReport(code == 0, time.Since(start)); err != nil {
		fmt.Fprintln(os.Stderr, "integration: writing the reliability report:", err)
		return 1
	}
	return code
}

// moduleRoot returns the directory of the module's go.mod, asking `go env GOMOD` first and
// walking up from the working directory if that fails.
func moduleRoot() (string, error) {
	if out, err := exec.Command("go", "env", "GOMOD").Output(); err == nil {
		if gomod := strings.TrimSpace(string(out)); gomod != "" && gomod != os.DevNull {
			return filepath.Dir(gomod), nil
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("integration: no go.mod above the working directory")
		}
		dir = parent
	}
}

// requireTool skips (or fails, see [testenv.SkipOrFail]) unless the named program is on PATH.
func requireTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		testenv.SkipOrFail(t, "%s not installed: %v", name, err)
	}
	return p
}

// logBuffer collects a process's output and closes ready once the output matches marker.
// It is safe for concurrent use.
type logBuffer struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	marker *regexp.Regexp
	ready  chan struct{}
	once   sync.Once
}

// newLogBuffer returns a buffer that watches for marker (nil: never ready).
func newLogBuffer(marker *regexp.Regexp) *logBuffer {
	return &logBuffer{marker: marker, ready: make(chan struct{})}
}

// Write appends p and signals readiness on the first match of the marker.
func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if b.marker != nil && b.marker.Match(b.buf.Bytes()) {
		b.once.Do(func() { close(b.ready) })
	}
	return len(p), nil
}

// String returns everything written so far.
func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// daemonOpts configures [startDaemon]; the zero value mounts a fresh mountpoint and state.
type daemonOpts struct {
	mountpoint      string        // empty: a new t.TempDir()
	state           string        // empty: "state" inside a new t.TempDir(), created by the daemon
	leaseDuration   time.Duration // 0: the daemon's default
	allowOther      bool
	maxLeasesPerUID int           // 0: the daemon's default
	takeover        bool          // pass --takeover: ask a daemon serving the state to hand over
	takeoverTimeout time.Duration // 0: the daemon's default --takeover-timeout
	env             []string      // KEY=VALUE entries added to the daemon's environment
	metricsAddr     string        // non-empty: pass --metrics-addr (see [daemon.metricsURL])
	extraArgs       []string      // more flags of leasefs mount, e.g. --store etcd://…
	readyTimeout    time.Duration // 0: 15 s to wait for msg=mounted
}

// daemon is one running `leasefs mount` process started by [startDaemon].
type daemon struct {
	t          testing.TB
	cmd        *exec.Cmd
	pid        int
	mountpoint string
	state      string
	errBuf     *logBuffer
	exited     chan struct{} // closed once the process has been waited for
}

// startDaemon starts `leasefs mount` and waits up to 15 s (opts.readyTimeout) for its `msg=mounted` log line.
// It fails the test with the daemon's stderr if the process exits first. Cleanup stops the
// daemon if it still runs and always detaches the mountpoint.
func startDaemon(t testing.TB, opts daemonOpts) *daemon {
	t.Helper()
	testenv.RequireFUSE(t)
	mp := opts.mountpoint
	if mp == "" {
		mp = t.TempDir()
	}
	// mountinfo shows resolved paths. Only the parent is resolved: the
	// mountpoint itself may still carry the mount of a killed daemon stuck
	// in the kernel, where a stat would hang until its connection is
	// aborted (which the new daemon does).
	if real, err := filepath.EvalSymlinks(filepath.Dir(mp)); err == nil {
		mp = filepath.Join(real, filepath.Base(mp))
	}
	state := opts.state
	if state == "" {
		state = filepath.Join(t.TempDir(), "state")
	}
	args := []string{"mount", "--state", state}
	if opts.leaseDuration > 0 {
		args = append(args, "--lease-duration", opts.leaseDuration.String())
	}
	if opts.allowOther {
		args = append(args, "--allow-other")
	}
	if opts.maxLeasesPerUID > 0 {
		args = append(args, "--max-leases-per-uid", strconv.Itoa(opts.maxLeasesPerUID))
	}
	if opts.takeover {
		args = append(args, "--takeover")
	}
	if opts.takeoverTimeout > 0 {
		args = append(args, "--takeover-timeout", opts.takeoverTimeout.String())
	}
	if opts.metricsAddr != "" {
		args = append(args, "--metrics-addr", opts.metricsAddr)
	}
	args = append(args, opts.extraArgs...)
	if !slices.Contains(opts.extraArgs, "--store") {
		args = append(args, storeArgs(state)...)
	}
	args = append(args, mp)

	d := &daemon{t: t, mountpoint: mp, state: state, errBuf: newLogBuffer(mountedRE), exited: make(chan struct{})}
	d.cmd = exec.Command(leasefsBin, args...)
	d.cmd.Dir = "/"
	d.cmd.Env = append(os.Environ(), opts.env...)
	d.cmd.Stdout = newLogBuffer(nil)
	d.cmd.Stderr = d.errBuf
	d.cmd.WaitDelay = 2 * time.Second
	// Pdeathsig: if the test binary dies (e.g. a -timeout panic skips t.Cleanup), the daemon
	// still gets SIGTERM and unmounts.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start leasefs: %v", err)
	}
	d.pid = d.cmd.Process.Pid
	go func() {
		_ = d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-d.exited:
		default:
			d.shutdown(false)
		}
		detach(t, mp)
		for _, r := range raceReports(d.stderr()) {
			t.Errorf("the race detector found a data race in leasefs mount (pid %d):\n%s", d.pid, r)
		}
	})

	select {
	case <-d.errBuf.ready:
	case <-d.exited:
		t.Fatalf("leasefs mount exited (code %d) before msg=mounted; stderr:\n%s",
			d.cmd.ProcessState.ExitCode(), d.stderr())
	case <-time.After(cmp.Or(opts.readyTimeout, 15*time.Second)):
		d.shutdown(false)
		t.Fatalf("leasefs mount not ready after %v; stderr:\n%s", cmp.Or(opts.readyTimeout, 15*time.Second), d.stderr())
	}
	if mountCount(t, mp) == 0 {
		t.Fatalf("msg=mounted logged but %s is not in /proc/self/mountinfo; stderr:\n%s", mp, d.stderr())
	}
	return d
}

// raceMarker starts each report of the race detector.
const raceMarker = "WARNING: DATA RACE"

// raceReports returns the race detector's reports in a process's log: each from the
// "==================" line before its [raceMarker] to the one after.
func raceReports(log string) []string {
	const rule = "=================="
	var out []string
	for {
		i := strings.Index(log, raceMarker)
		if i < 0 {
			return out
		}
		start := strings.LastIndex(log[:i], rule)
		if start < 0 {
			start = i
		}
		end := len(log)
		if j := strings.Index(log[i:], rule); j >= 0 {
			end = i + j + len(rule)
		}
		out = append(out, log[start:end])
		log = log[end:]
	}
}

// stderr returns the daemon's stderr so far. It is safe for concurrent use.
func (d *daemon) stderr() string { return d.errBuf.String() }

// running reports whether the daemon process has not exited yet.
func (d *daemon) running() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM, waits up to 10 s (then SIGKILLs) and returns the exit code; with
// requireClean it fails the test unless the daemon exited by itself with code 0.
func (d *daemon) stop(requireClean bool) int {
	d.t.Helper()
	clean := d.shutdown(true)
	code := d.cmd.ProcessState.ExitCode()
	if requireClean && (!clean || code != 0) {
		d.t.Errorf("leasefs mount: exit code %d after SIGTERM (exited in time: %v), want 0; stderr:\n%s",
			code, clean, d.stderr())
	}
	return code
}

// kill sends SIGKILL and waits for the process; the mount is left behind, stale.
//
// A daemon killed while one of its threads waits in the kernel on its own
// mount (a kernel notification behind a request only it could answer)
// cannot exit until its FUSE connection is aborted; the next daemon started
// on its state directory does that (mount.abortDyingHolder), and so does
// cleanup. kill therefore waits only briefly for the exit.
func (d *daemon) kill() {
	d.t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-d.exited:
	case <-time.After(3 * time.Second):
		d.t.Logf("leasefs pid %d is stuck in the kernel after SIGKILL; the next daemon aborts its connection", d.pid)
	}
}

// shutdown ends the process: SIGTERM (when term), up to 10 s, then SIGKILL, then aborting the
// FUSE connection if the process is stuck. It reports whether the process exited before SIGKILL.
func (d *daemon) shutdown(term bool) bool {
	if term {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
			return true
		case <-time.After(10 * time.Second):
		}
	}
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-d.exited:
		return false
	case <-time.After(5 * time.Second):
	}
	_ = mount.AbortConnection(d.mountpoint) // a daemon blocked on its own mount sits in D state
	select {
	case <-d.exited:
	case <-time.After(5 * time.Second):
		d.t.Errorf("leasefs pid %d did not exit after SIGKILL and abort", d.pid)
	}
	return false
}

// detach lazily unmounts everything mounted on mp, ignoring "not mounted" (EINVAL, ENOENT).
func detach(t testing.TB, mp string) {
	t.Helper()
	for range 8 { // stacked mounts are detached one at a time
		err := unix.Unmount(mp, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return
		}
		if err != nil {
			t.Errorf("unmount %s: %v", mp, err)
			return
		}
	}
}

// mountCount returns how many mounts sit on mp according to /proc/self/mountinfo.
func mountCount(t testing.TB, mp string) int {
	t.Helper()
	n := 0
	for _, e := range procfs.Mounts() {
		if e.Point == mp {
			n++
		}
	}
	return n
}

// waitExit waits up to timeout for the daemon to exit by itself and returns its exit code;
// ok is false if it is still running.
func (d *daemon) waitExit(timeout time.Duration) (code int, ok bool) {
	select {
	case <-d.exited:
		return d.cmd.ProcessState.ExitCode(), true
	case <-time.After(timeout):
		return -1, false
	}
}
