package client_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/internal/testenv"
)

// holdWithFlock holds name with flock(1) in another process until the test
// ends; it returns that process's pid once the lock is held.
func holdWithFlock(t *testing.T, name string) int {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := exec.Command("flock", "-n", filepath.Join(mnt, name), "sh", "-c", `touch "$0"; exec sleep 60`, ready)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			return cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("flock(1) did not take %s", name)
		}
	}
}

func TestHeldErrorNamesTheHolder(t *testing.T) {
	pid := holdWithFlock(t, "held-by-flock")
	host, _ := os.Hostname()
	for _, try := range []struct {
		name  string
		errno syscall.Errno
		call  func() error
	}{
		{"TryLock", syscall.EWOULDBLOCK, func() error { _, err := client.TryLock(mnt, "held-by-flock"); return err }},
		{"Reserve", syscall.EEXIST, func() error { _, err := client.Reserve(mnt, "held-by-flock"); return err }},
	} {
		err := try.call()
		var held *client.HeldError
		if !errors.As(err, &held) || !errors.Is(err, client.ErrHeld) || !errors.Is(err, try.errno) {
			t.Fatalf("%s of a name flock(1) holds: %v, want a HeldError wrapping ErrHeld and %v", try.name, err, try.errno)
		}
		if held.PID != pid || held.UID != os.Getuid() || held.Host != host || held.Since.IsZero() {
			t.Errorf("%s: holder %+v, want pid %d uid %d host %s and a start time", try.name, held, pid, os.Getuid(), host)
		}
		if want := "held-by-flock is held by uid " + strconv.Itoa(os.Getuid()) + " pid " + strconv.Itoa(pid); !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %q does not say %q", try.name, err, want)
		}
	}
}

// TestConflictLeavesTheHoldersToken: a name reserved by `: > name` whose
// token its holder has not read yet (same uid), met by TryLock, Reserve
// and Stat: each names the holder, and the holder's first read still
// gets its token (docs/PROTOCOL.md §3, "Choices"), since the client reads
// another's lease through its extended attributes.
func TestConflictLeavesTheHoldersToken(t *testing.T) {
	path := filepath.Join(mnt, "reserved-unread")
	fd, err := syscall.Open(path, syscall.O_CREAT|syscall.O_EXCL|syscall.O_WRONLY|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(fd)
	t.Cleanup(func() { _ = os.Remove(path) })
	if _, err := client.TryLock(mnt, "reserved-unread"); !errors.Is(err, client.ErrHeld) {
		t.Fatalf("TryLock of a reserved name: %v, want ErrHeld", err)
	}
	var held *client.HeldError
	if _, err := client.Reserve(mnt, "reserved-unread"); !errors.As(err, &held) || held.UID != os.Getuid() || held.Since.IsZero() {
		t.Fatalf("Reserve of a reserved name: %v (%+v), want a HeldError naming uid %d", err, held, os.Getuid())
	}
	st, err := client.Stat(mnt, "reserved-unread")
	if err != nil || st.Mode != "token" || st.State != "active" || st.HolderUID != os.Getuid() {
		t.Fatalf("Stat of a reserved name: %+v, %v", st, err)
	}
	tok, err := os.ReadFile(path)
	if err != nil || !strings.HasPrefix(string(tok), "hwl_") {
		t.Fatalf("the holder's first read after the conflicts: %q, %v; want its token", tok, err)
	}
}

func TestErrorsOfBadPlaces(t *testing.T) {
	_, err := client.Reserve(mnt, "ci/deploy")
	var ns *client.NamespaceError
	if !errors.As(err, &ns) || !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("Reserve in a missing namespace: %v, want a NamespaceError wrapping ENOENT", err)
	}
	if want := "namespace ci does not exist: mkdir " + filepath.Join(mnt, "ci"); err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if _, err := client.Lock(context.Background(), mnt, "ci/a/b"); !errors.Is(err, client.ErrNoNamespace) {
		t.Errorf("Lock in a missing namespace: %v, want ErrNoNamespace", err)
	}
	plain := t.TempDir()
	if _, err := client.Reserve(plain, "x"); !errors.Is(err, client.ErrNotMounted) {
		t.Errorf("Reserve in a plain directory: %v, want ErrNotMounted", err)
	}
	if _, err := os.Stat(filepath.Join(plain, "x")); !os.IsNotExist(err) {
		t.Errorf("Reserve created %s in a plain directory", filepath.Join(plain, "x"))
	}
	for _, name := range []string{"", "/abs", "../up", "a//b", "a/./b"} {
		if _, err := client.TryLock(mnt, name); err == nil {
			t.Errorf("TryLock(%q) succeeded", name)
		}
	}
	if _, err := client.Reserve(mnt, strings.Repeat("n", 256)); !errors.Is(err, syscall.ENAMETOOLONG) {
		t.Errorf("Reserve of a 256-byte name: %v, want ENAMETOOLONG", err)
	}
}

func TestRenewAnnotatesAndEndsFree(t *testing.T) {
	l, err := client.Reserve(mnt, "annotated")
	if err != nil {
		t.Fatal(err)
	}
	before := l.Status().HeartbeatAt
	time.Sleep(10 * time.Millisecond)
	a := client.Annotations{"client": `bot "q" \ x`, "pid": strconv.Itoa(os.Getpid()), "path": "/srv/x"}
	if err := l.Renew(a); err != nil {
		t.Fatal(err)
	}
	st := l.Status()
	if st.Fields["client"] != a["client"] || st.Fields["pid"] != a["pid"] || st.Fields["path"] != "/srv/x" {
		t.Errorf("after Renew(%v) the status has %v", a, st.Fields)
	}
	if !st.HeartbeatAt.After(before) {
		t.Errorf("heartbeat %v did not move past %v", st.HeartbeatAt, before)
	}
	if err := l.Renew(client.Annotations{"nonsense": "x"}); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("Renew with an unknown key: %v, want EINVAL", err)
	}
	if err := l.Abandon(client.Annotations{"anchor_state": "gave up"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mnt, "annotated")); !os.IsNotExist(err) {
		t.Errorf("name not free after Abandon: %v", err)
	}
	if err := l.Renew(nil); err == nil {
		t.Error("Renew after Abandon succeeded")
	}
}

func TestEndedLeasesAreLost(t *testing.T) {
	l, err := client.Reserve(mnt, "removed")
	if err != nil {
		t.Fatal(err)
	}
	h, err := client.TryLock(mnt, "removed-lock")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Unlock()
	for _, name := range []string{"removed", "removed-lock"} {
		if err := os.Remove(filepath.Join(mnt, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Renew(nil); !errors.Is(err, client.ErrLost) || !errors.Is(err, syscall.ESTALE) {
		t.Errorf("Renew of a removed lease: %v, want ErrLost wrapping ESTALE", err)
	}
	if err := h.Check(); !errors.Is(err, client.ErrLost) || !errors.Is(err, syscall.ESTALE) {
		t.Errorf("Check of a removed handle lease: %v, want ErrLost wrapping ESTALE", err)
	}
	ka := h.KeepAlive(context.Background())
	if err := <-ka; !errors.Is(err, client.ErrLost) {
		t.Errorf("KeepAlive of a removed handle lease sent %v, want ErrLost", err)
	}
}

func TestKeepAliveRenewsPastTheLeaseDuration(t *testing.T) {
	l, err := client.Reserve(mnt, "kept")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	lost := l.KeepAlive(ctx)
	time.Sleep(2 * leaseDuration)
	select {
	case err := <-lost:
		t.Fatalf("keep-alive ended: %v", err)
	default:
	}
	if err := l.Renew(nil); err != nil {
		t.Fatalf("the lease did not outlive two lease durations: %v", err)
	}
	cancel()
	if err := <-lost; err != nil {
		t.Errorf("KeepAlive after cancel sent %v, want nil", err)
	}
	if err := l.Complete(nil); err != nil {
		t.Fatal(err)
	}
}

// A blocking Lock waits first come first served in the kernel and is
// granted when the holder unlocks; cancelling one waiter leaves the others
// queued.
func TestLockWaitsAndIsGranted(t *testing.T) {
	holder, err := client.TryLock(mnt, "queue")
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	gotCancelled := make(chan error, 1)
	go func() { _, err := client.Lock(cancelled, mnt, "queue"); gotCancelled <- err }()
	granted := make(chan *client.HandleLease, 1)
	go func() {
		h, err := client.Lock(context.Background(), mnt, "queue")
		if err != nil {
			t.Error(err)
		}
		granted <- h
	}()
	testenv.WaitFor(t, "two waiters", func() bool { return waiters(t, "queue") == 2 })
	cancel()
	if err := <-gotCancelled; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Lock: %v, want context.Canceled", err)
	}
	testenv.WaitFor(t, "one waiter after the cancel", func() bool { return waiters(t, "queue") == 1 })
	gen := holder.Generation()
	if err := holder.Unlock(); err != nil {
		t.Fatal(err)
	}
	h := <-granted
	if h == nil {
		t.FailNow()
	}
	defer h.Unlock()
	if h.Generation() <= gen {
		t.Errorf("the waiter's generation %d is not above the holder's %d", h.Generation(), gen)
	}
	if st := h.Status(); st.HolderPID != os.Getpid() {
		t.Errorf("holder_pid %d, want this process %d (not the waiting child)", st.HolderPID, os.Getpid())
	}
}

// Both kinds of lease ride out a daemon restart: the keep-alive of a token
// lease renews through the next daemon, and a handle lease is taken back
// with the same lease id (docs/PROTOCOL.md §2).
func TestLeasesSurviveADaemonRestart(t *testing.T) {
	var mu sync.Mutex
	var events []client.Event
	notify := client.WithNotify(func(e client.Event) { mu.Lock(); events = append(events, e); mu.Unlock() })
	l, err := client.Reserve(mnt, "restart-token", notify)
	if err != nil {
		t.Fatal(err)
	}
	h, err := client.TryLock(mnt, "restart-handle", notify)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Unlock()
	tokenID, handleID := l.ID(), h.ID()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lostToken, lostHandle := l.KeepAlive(ctx), h.KeepAlive(ctx)

	restartDaemon(t)
	testenv.WaitFor(t, "both leases taken back", func() bool {
		mu.Lock()
		defer mu.Unlock()
		back := map[string]bool{}
		for _, e := range events {
			if e.Kind == client.TakenBack {
				back[e.Resource] = true
			}
		}
		return back["restart-token"] && back["restart-handle"]
	})
	select {
	case err := <-lostToken:
		t.Fatalf("token keep-alive ended: %v", err)
	case err := <-lostHandle:
		t.Fatalf("handle keep-alive ended: %v", err)
	default:
	}
	if err := h.Check(); err != nil || h.Away() || h.ID() != handleID {
		t.Errorf("handle lease after the restart: %v, away %v, id %s want %s", err, h.Away(), h.ID(), handleID)
	}
	if err := l.Renew(nil); err != nil || l.ID() != tokenID {
		t.Errorf("token lease after the restart: %v, id %s want %s", err, l.ID(), tokenID)
	}
	if _, err := client.TryLock(mnt, "restart-handle"); !errors.Is(err, client.ErrHeld) {
		t.Errorf("another TryLock after the restart: %v, want ErrHeld", err)
	}
	if err := l.Complete(nil); err != nil {
		t.Fatal(err)
	}
}

// waiters returns the waiters key of name's status document (0 when
// absent).
func waiters(t *testing.T, name string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(mnt, name))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "waiters = "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}
