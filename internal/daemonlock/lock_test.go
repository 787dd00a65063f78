package daemonlock

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/internal/procfs"
)

// lockHelperEnv names the lock file that TestHelperProcessHoldsLock holds when
// the test binary is re-executed as a lock-holding child.
const lockHelperEnv = "DAEMONLOCK_TEST_HOLD_LOCK"

const helperClient = "daemonlock test helper"

// TestHelperProcessHoldsLock is not a test: run as a child process (see
// startLockHolder) it acquires the lock named by lockHelperEnv, prints
// "locked" and holds the lock until its stdin is closed, then exits without
// releasing, leaving the release to the kernel.
func TestHelperProcessHoldsLock(t *testing.T) {
	path := os.Getenv(lockHelperEnv)
	if path == "" {
		t.Skip("helper process for the cross-process lock tests")
	}
	l, err := Acquire(path, CurrentHolder(helperClient))
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("locked\n")
	io.Copy(io.Discard, os.Stdin)
	runtime.KeepAlive(l) // held until exit; never released
}

// lockHolder is a child process holding a lock (see TestHelperProcessHoldsLock).
type lockHolder struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	stderr bytes.Buffer
	waited bool
}

// startLockHolder starts a child process that holds the lock at path and
// returns once the child reports that it holds it.
func startLockHolder(t *testing.T, path string) *lockHolder {
	t.Helper()
	p := &lockHolder{}
	p.cmd = exec.Command(os.Args[0], "-test.run=^TestHelperProcessHoldsLock$", "-test.count=1")
	p.cmd.Env = append(os.Environ(), lockHelperEnv+"="+path)
	p.cmd.Stderr = &p.stderr
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.stdout = bufio.NewReader(stdout)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !p.waited {
			p.cmd.Process.Kill()
			p.wait()
		}
	})
	var out strings.Builder
	for {
		line, err := p.stdout.ReadString('\n')
		if strings.TrimSpace(line) == "locked" {
			return p
		}
		out.WriteString(line)
		if err != nil {
			werr := p.wait()
			t.Fatalf("lock holder exited before locking (%v)\nstdout:\n%s\nstderr:\n%s", werr, out.String(), p.stderr.String())
		}
	}
}

// wait drains the child's stdout and waits for it to exit.
func (p *lockHolder) wait() error {
	io.Copy(io.Discard, p.stdout)
	p.waited = true
	return p.cmd.Wait()
}

// checkHeldByOther asserts that acquiring path fails because process pid
// holds it.
func checkHeldByOther(t *testing.T, path string, pid int) {
	t.Helper()
	l, err := Acquire(path, CurrentHolder("test"))
	if err == nil {
		l.Release()
		t.Fatal("Acquire succeeded while another process holds the lock")
	}
	if !errors.Is(err, ErrHeld) {
		t.Fatalf("error %v does not match ErrHeld", err)
	}
	he, ok := errors.AsType[*HeldError](err)
	if !ok {
		t.Fatalf("error %T is not a *HeldError", err)
	}
	if he.SameProcess {
		t.Error("SameProcess is set for a lock held by another process")
	}
	if he.Holder.PID != pid || he.Holder.Client != helperClient {
		t.Errorf("holder = %+v, want pid %d client %q", he.Holder, pid, helperClient)
	}
	if he.Holder.Dead() {
		t.Error("a running holder is reported dead")
	}
}

func TestLockHeldByOtherProcess(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "leasefs.lock")
	child := startLockHolder(t, path)

	checkHeldByOther(t, path, child.cmd.Process.Pid)

	child.stdin.Close()
	if err := child.wait(); err != nil {
		t.Fatalf("lock holder: %v\nstderr:\n%s", err, child.stderr.String())
	}
	// The child exited without Release: the kernel dropped its lock.
	l, err := Acquire(path, CurrentHolder("test"))
	if err != nil {
		t.Fatalf("acquire after the holder exited: %v", err)
	}
	defer l.Release()
	if h, ok := ReadHolder(path); !ok || h.PID != os.Getpid() {
		t.Errorf("metadata after takeover = %+v, %v; want this process", h, ok)
	}
}

func TestLockReleasedWhenHolderKilled(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "leasefs.lock")
	child := startLockHolder(t, path)
	pid := child.cmd.Process.Pid

	checkHeldByOther(t, path, pid)

	if err := child.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	child.wait()
	if ws, ok := child.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("lock holder ended with %v, want killed by SIGKILL", child.cmd.ProcessState)
	}
	// Its metadata is left behind, naming a holder that is gone.
	stale, ok := ReadHolder(path)
	if !ok || stale.PID != pid {
		t.Fatalf("stale metadata = %+v, %v; want pid %d", stale, ok, pid)
	}
	if procfs.BootID() != "" && !stale.Dead() {
		t.Errorf("killed holder %v is not reported dead", stale)
	}

	l, err := Acquire(path, CurrentHolder("test"))
	if err != nil {
		t.Fatalf("acquire after the holder was killed: %v", err)
	}
	defer l.Release()
	if h, ok := ReadHolder(path); !ok || h.PID != os.Getpid() {
		t.Errorf("metadata after takeover = %+v, %v; want this process", h, ok)
	}
}

func TestLockSameProcess(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "leasefs.lock")
	first := CurrentHolder("first")
	l, err := Acquire(path, first)
	if err != nil {
		t.Fatal(err)
	}

	// Another spelling of the same path is the same lock.
	for _, p := range []string{path, dir + "/./leasefs.lock"} {
		_, err = Acquire(p, CurrentHolder("second"))
		he, ok := errors.AsType[*HeldError](err)
		if !ok {
			t.Fatalf("second acquire of %s: err = %v, want *HeldError", p, err)
		}
		if !errors.Is(err, ErrHeld) || !he.SameProcess || he.Holder.Client != "first" || he.Path != path {
			t.Errorf("second acquire of %s: %#v", p, he)
		}
	}

	// A spelling through a symlink escapes the registry, but flock(2) locks
	// taken through separate opens conflict even within one process.
	alias := filepath.Join(t.TempDir(), "alias")
	if err := os.Symlink(dir, alias); err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(filepath.Join(alias, "leasefs.lock"), CurrentHolder("third"))
	if he, ok := errors.AsType[*HeldError](err); !ok || he.SameProcess || he.Holder.PID != os.Getpid() {
		t.Errorf("acquire through a symlink: %v, want *HeldError naming this pid from metadata", err)
	}

	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Errorf("second Release: %v", err)
	}
	l2, err := Acquire(path, CurrentHolder("again"))
	if err != nil {
		t.Fatalf("acquire after Release: %v", err)
	}
	if err := l2.Release(); err != nil {
		t.Fatal(err)
	}
}

func TestLockReleaseZero(t *testing.T) {
	t.Parallel()
	var nilLock *Lock
	if err := nilLock.Release(); err != nil {
		t.Errorf("nil Release: %v", err)
	}
	if err := new(Lock).Release(); err != nil {
		t.Errorf("zero Release: %v", err)
	}
}

func TestLockConcurrentAcquire(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "leasefs.lock")
	const n = 16
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		won   []*Lock
		other []error
	)
	for range n {
		wg.Go(func() {
			l, err := Acquire(path, CurrentHolder("racer"))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				other = append(other, err)
			} else {
				won = append(won, l)
			}
		})
	}
	wg.Wait()
	if len(won) != 1 {
		t.Fatalf("%d acquires succeeded, want 1", len(won))
	}
	defer won[0].Release()
	for _, err := range other {
		if he, ok := errors.AsType[*HeldError](err); !ok || !he.SameProcess {
			t.Errorf("losing acquire: %v, want *HeldError with SameProcess", err)
		}
	}
}

func TestLockMetadata(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "leasefs.lock")
	if _, ok := ReadHolder(path); ok {
		t.Fatal("ReadHolder found metadata before any acquire")
	}
	// Metadata left by a crashed holder is replaced on acquire.
	if err := os.WriteFile(path+".json", []byte(`{"pid": 1, "client": "stale"}`), 0o600); err != nil {
		t.Fatal(err)
	}

	want := Holder{
		PID:       os.Getpid(),
		BootID:    procfs.BootID(),
		Host:      procfs.Hostname(),
		Client:    "leasefs mount /mnt/x",
		StartedAt: time.Date(2026, 11, 30, 2, 0, 0, 123456789, time.UTC),
	}
	l, err := Acquire(path, want)
	if err != nil {
		t.Fatal(err)
	}
	if l.Path() != path || l.Holder() != want {
		t.Errorf("Path, Holder = %q, %+v; want %q, %+v", l.Path(), l.Holder(), path, want)
	}
	got, ok := ReadHolder(path)
	if !ok || got.PID != want.PID || got.BootID != want.BootID || got.Host != want.Host ||
		got.Client != want.Client || !got.StartedAt.Equal(want.StartedAt) {
		t.Errorf("ReadHolder = %+v, %v; want %+v", got, ok, want)
	}
	if fi, err := os.Stat(path + ".json"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("metadata file: %v, %v; want mode 0600", fi, err)
	}

	if err := WriteTakeoverRequest(path, TakeoverRequest{Requester: CurrentHolder("asker")}); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if _, ok := ReadHolder(path); ok {
		t.Error("metadata survives Release")
	}
	if _, ok := ReadTakeoverRequest(path); ok {
		t.Error("takeover request survives Release")
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("lock file removed by Release: %v", err)
	}
}

func TestLockStartedAtDefault(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "leasefs.lock")
	before := time.Now()
	l, err := Acquire(path, Holder{PID: os.Getpid(), Client: "no time"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if at := l.Holder().StartedAt; at.Before(before) {
		t.Errorf("StartedAt = %v, want the acquisition time (after %v)", at, before)
	}
}

func TestAcquireMissingDir(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, "leasefs.lock")
	_, err := Acquire(path, CurrentHolder("test"))
	if err == nil || errors.Is(err, ErrHeld) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("acquire in a missing directory: %v, want a not-exist error", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name %s", err, path)
	}
	// The failed attempt left no registration behind.
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := Acquire(path, CurrentHolder("test"))
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
}

func TestTakeoverRequestRoundTrip(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "leasefs.lock")
	if _, ok := ReadTakeoverRequest(path); ok {
		t.Fatal("ReadTakeoverRequest found a request before any was written")
	}
	if err := ClearTakeoverRequest(path); err != nil {
		t.Errorf("Clear with no request: %v", err)
	}

	want := TakeoverRequest{
		Requester: CurrentHolder("leasefs mount /mnt/y"),
		At:        time.Date(2026, 11, 30, 2, 5, 0, 0, time.UTC),
		Reason:    "upgrade",
	}
	if err := WriteTakeoverRequest(path, want); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "leasefs.takeover")); err != nil {
		t.Errorf("request not at <state>/leasefs.takeover: %v", err)
	}
	got, ok := ReadTakeoverRequest(path)
	if !ok || got.Reason != want.Reason || !got.At.Equal(want.At) ||
		got.Requester.PID != want.Requester.PID || got.Requester.Client != want.Requester.Client ||
		!got.Requester.StartedAt.Equal(want.Requester.StartedAt) {
		t.Errorf("ReadTakeoverRequest = %+v, %v; want %+v", got, ok, want)
	}

	if err := ClearTakeoverRequest(path); err != nil {
		t.Fatal(err)
	}
	if _, ok := ReadTakeoverRequest(path); ok {
		t.Error("request survives Clear")
	}
	if err := ClearTakeoverRequest(path); err != nil {
		t.Errorf("second Clear: %v", err)
	}
}

func TestTakeoverRequestDefaultsAt(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "leasefs.lock")
	before := time.Now()
	if err := WriteTakeoverRequest(path, TakeoverRequest{Requester: CurrentHolder("asker")}); err != nil {
		t.Fatal(err)
	}
	got, ok := ReadTakeoverRequest(path)
	if !ok || got.At.Before(before.Truncate(time.Second)) {
		t.Errorf("At = %v, %v; want the write time", got.At, ok)
	}
}

func TestTakeoverRequestMalformed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "leasefs.lock")
	if err := os.WriteFile(filepath.Join(dir, "leasefs.takeover"), []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := ReadTakeoverRequest(path); ok {
		t.Error("malformed request read as valid")
	}
	if err := os.WriteFile(path+".json", []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := ReadHolder(path); ok {
		t.Error("malformed metadata read as valid")
	}
}

func TestLockSidePaths(t *testing.T) {
	t.Parallel()
	tests := []struct {
		lock, metadata, takeover string
	}{
		{"/state/leasefs.lock", "/state/leasefs.lock.json", "/state/leasefs.takeover"},
		{"/state/other", "/state/other.json", "/state/other.takeover"},
	}
	for _, tt := range tests {
		if got := metadataPath(tt.lock); got != tt.metadata {
			t.Errorf("metadataPath(%q) = %q, want %q", tt.lock, got, tt.metadata)
		}
		if got := takeoverPath(tt.lock); got != tt.takeover {
			t.Errorf("takeoverPath(%q) = %q, want %q", tt.lock, got, tt.takeover)
		}
	}
}

func TestHolderDead(t *testing.T) {
	t.Parallel()
	self := CurrentHolder("test")
	with := func(f func(*Holder)) Holder {
		h := self
		f(&h)
		return h
	}
	// 4194303 is the largest pid Linux can hand out (PID_MAX_LIMIT-1).
	const gonePID = 4194303
	tests := []struct {
		name string
		h    Holder
		want bool
	}{
		{"this process", self, false},
		{"gone pid", with(func(h *Holder) { h.PID = gonePID }), true},
		{"gone pid on another host", with(func(h *Holder) { h.PID = gonePID; h.Host = "elsewhere" }), false},
		{"gone pid in another boot", with(func(h *Holder) { h.PID = gonePID; h.BootID = "00000000-0000-0000-0000-000000000000" }), false},
		{"gone pid, no boot id", with(func(h *Holder) { h.PID = gonePID; h.BootID = "" }), false},
		{"gone pid, no host", with(func(h *Holder) { h.PID = gonePID; h.Host = "" }), false},
		{"pid 0", with(func(h *Holder) { h.PID = 0 }), false},
		{"negative pid", with(func(h *Holder) { h.PID = -1 }), false},
		{"zero value", Holder{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want {
				if procfs.BootID() == "" {
					t.Skip("no boot id on this machine: Dead cannot be sure")
				}
				if err := unix.Kill(tt.h.PID, 0); !errors.Is(err, unix.ESRCH) {
					t.Skipf("pid %d is in use here (%v)", tt.h.PID, err)
				}
			}
			if got := tt.h.Dead(); got != tt.want {
				t.Errorf("Dead() = %v, want %v for %+v", got, tt.want, tt.h)
			}
		})
	}
}

func TestHolderString(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 3, 0, 0, 500, time.FixedZone("CET", 3600))
	tests := []struct {
		h    Holder
		want string
	}{
		{Holder{PID: 123, Host: "vm", Client: "leasefs mount /mnt/x", StartedAt: at},
			"leasefs mount /mnt/x (pid 123 on host vm, since 2026-11-30T02:00:00Z)"},
		{Holder{PID: 123, Client: "c"}, "c (pid 123)"},
		{Holder{Host: "vm", Client: "c"}, "c (on host vm)"},
		{Holder{Client: "another process"}, "another process"},
		{Holder{}, "unknown holder"},
	}
	for _, tt := range tests {
		if got := tt.h.String(); got != tt.want {
			t.Errorf("%+v.String() = %q, want %q", tt.h, got, tt.want)
		}
	}
}

func TestCurrentHolder(t *testing.T) {
	t.Parallel()
	before := time.Now()
	h := CurrentHolder("leasefs mount /mnt/z")
	if h.PID != os.Getpid() || h.BootID != procfs.BootID() || h.Host != procfs.Hostname() ||
		h.Client != "leasefs mount /mnt/z" || h.StartedAt.Before(before) {
		t.Errorf("CurrentHolder = %+v", h)
	}
	if procfs.Hostname() == "" {
		t.Error("Hostname is empty")
	}
}

func TestHeldError(t *testing.T) {
	t.Parallel()
	err := error(&HeldError{Path: "/state/leasefs.lock", Holder: Holder{PID: 7, Host: "vm", Client: "c"}})
	if want := "daemonlock: /state/leasefs.lock is held by c (pid 7 on host vm)"; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
	if !errors.Is(err, ErrHeld) {
		t.Error("HeldError does not match ErrHeld")
	}
	if errors.Is(err, errors.New(ErrHeld.Error())) {
		t.Error("HeldError matches a sentinel other than ErrHeld")
	}
}

func TestHeld(t *testing.T) {
	path := filepath.Join(t.TempDir(), "leasefs.lock")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if held, ok := Held(path); !ok || held {
		t.Fatalf("Held(unlocked) = %v, %v; want false, true", held, ok)
	}
	lock, err := Acquire(path, CurrentHolder("test"))
	if err != nil {
		t.Fatal(err)
	}
	if held, ok := Held(path); !ok || !held {
		t.Errorf("Held(locked) = %v, %v; want true, true", held, ok)
	}
	if err := lock.Release(); err != nil {
		t.Fatal(err)
	}
	if held, _ := Held(path); held {
		t.Errorf("Held after Release = true")
	}
	if _, ok := Held(filepath.Join(t.TempDir(), "missing")); ok {
		t.Errorf("Held(missing) ok = true")
	}
}

// A FIFO in the lock file's place (or its metadata's) does not block
// Acquire: the lock is refused with an error that names the path, and the
// metadata is ignored.
func TestAcquireFIFO(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "leasefs.lock")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		l, err := Acquire(path, CurrentHolder("test"))
		if err == nil {
			l.Release()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("acquire of a FIFO: %v, want an error naming %s", err, path)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("acquire of a FIFO lock file hangs")
	}
	var v map[string]any
	if readLockJSON(path, &v) {
		t.Error("readLockJSON decoded a FIFO")
	}
}
