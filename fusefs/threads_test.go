package fusefs

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// onThread runs fn on an OS thread of its own, other than the main one,
// and passes it that thread's id; the thread exits when fn returns.
func onThread(fn func(tid int)) {
	for {
		ran := make(chan bool)
		go func() {
			runtime.LockOSThread()
			tid := unix.Gettid()
			if tid == os.Getpid() {
				// The main thread must not exit: try another.
				runtime.UnlockOSThread()
				ran <- false
				return
			}
			// Never unlocked: the thread exits with the goroutine.
			fn(tid)
			ran <- true
		}()
		if <-ran {
			return
		}
	}
}

// needPidfdThread skips t on kernels without PIDFD_THREAD (before Linux
// 6.9), where the cache keeps nothing.
func needPidfdThread(t *testing.T) {
	t.Helper()
	fd, err := unix.PidfdOpen(os.Getpid(), unix.PIDFD_THREAD)
	if err != nil {
		t.Skipf("no PIDFD_THREAD: %v", err)
	}
	_ = unix.Close(fd)
}

// deadPidfd returns a pidfd of a process that has exited and been reaped.
func deadPidfd(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.PidfdOpen(cmd.Process.Pid, unix.PIDFD_THREAD)
	if err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	return fd
}

// A thread that is not its process's main one maps to the process, and
// the answer is cached while the thread lives.
func TestThreadGroupsMapThreads(t *testing.T) {
	needPidfdThread(t)
	g := &threadGroups{max: 8}
	t.Cleanup(func() { g.closeAll() })
	if got := g.tgid(os.Getpid()); got != os.Getpid() {
		t.Errorf("tgid(main thread) = %d, want %d", got, os.Getpid())
	}
	onThread(func(tid int) {
		for range 2 {
			if got := g.tgid(tid); got != os.Getpid() {
				t.Errorf("tgid(thread %d) = %d, want the process %d", tid, got, os.Getpid())
			}
		}
		if g.len() != 2 {
			t.Errorf("%d threads cached, want 2", g.len())
		}
	})
	if g.tgid(0) != 0 || g.tgid(-1) != -1 {
		t.Error("tgid of an unknown thread is not itself")
	}
}

// An entry is used only while its thread lives: when the thread of a
// cached id has exited and the id now names another thread (pid reuse),
// the entry is dropped and the id is resolved again.
func TestThreadGroupsReusedID(t *testing.T) {
	needPidfdThread(t)
	g := &threadGroups{max: 8}
	t.Cleanup(func() { g.closeAll() })
	// The entry of a previous owner of this process's id, now exited,
	// which belonged to another process.
	const stale = 424242
	g.entries = map[int]*threadEntry{os.Getpid(): {tid: os.Getpid(), tgid: stale, fd: deadPidfd(t)}}
	if got := g.tgid(os.Getpid()); got != os.Getpid() {
		t.Fatalf("tgid with a stale entry = %d, want %d (resolved again)", got, os.Getpid())
	}
	if e := g.entries[os.Getpid()]; e == nil || e.tgid != os.Getpid() || !threadAlive(e.fd) {
		t.Errorf("entry after the reuse = %+v, want a fresh one of the living thread", e)
	}
}

// A hit answers from the cache without reading /proc: an entry whose
// thread lives is believed.
func TestThreadGroupsHit(t *testing.T) {
	needPidfdThread(t)
	g := &threadGroups{max: 8}
	t.Cleanup(func() { g.closeAll() })
	fd, err := unix.PidfdOpen(os.Getpid(), unix.PIDFD_THREAD)
	if err != nil {
		t.Fatal(err)
	}
	const marked = 777
	g.entries = map[int]*threadEntry{os.Getpid(): {tid: os.Getpid(), tgid: marked, fd: fd}}
	if got := g.tgid(os.Getpid()); got != marked {
		t.Errorf("tgid = %d, want the cached %d", got, marked)
	}
}

// A thread that exits takes its entry with it at the next lookup, and
// an exited thread's id resolves to itself (no /proc entry).
func TestThreadGroupsExitedThread(t *testing.T) {
	needPidfdThread(t)
	g := &threadGroups{max: 8}
	t.Cleanup(func() { g.closeAll() })
	var tid int
	onThread(func(id int) {
		tid = id
		g.tgid(id)
	})
	waitUntil(t, "the thread to exit", func() bool {
		_, err := os.Stat("/proc/self/task/" + strconv.Itoa(tid))
		return err != nil
	})
	got := g.tgid(tid)
	if got != tid && got != os.Getpid() {
		// Another thread of this process may have been given the id.
		t.Errorf("tgid(exited thread %d) = %d, want itself", tid, got)
	}
	if e := g.entries[tid]; e != nil && !threadAlive(e.fd) {
		t.Errorf("the entry of exited thread %d is kept", tid)
	}
}

// The cache keeps at most max entries and closes the pidfds it drops.
func TestThreadGroupsBound(t *testing.T) {
	needPidfdThread(t)
	g := &threadGroups{max: 2}
	t.Cleanup(func() { g.closeAll() })
	before := openFDs(t)
	for range 5 {
		onThread(func(tid int) { g.tgid(tid) })
	}
	g.tgid(os.Getpid())
	if g.len() > 2 {
		t.Errorf("%d entries, want at most 2", g.len())
	}
	if after := openFDs(t); after > before+2 {
		t.Errorf("%d descriptors open, was %d: dropped pidfds are not closed", after, before)
	}
	g.closeAll()
	if after := openFDs(t); after > before {
		t.Errorf("%d descriptors open after closeAll, was %d", after, before)
	}
}

// max 0 caches nothing.
func TestThreadGroupsDisabled(t *testing.T) {
	g := &threadGroups{}
	if got := g.tgid(os.Getpid()); got != os.Getpid() || g.len() != 0 {
		t.Errorf("tgid = %d with %d entries, want %d and none", got, g.len(), os.Getpid())
	}
}

// The uid and gid of a caller are those of its request, whatever the
// cache holds for its thread: a thread that changed its credentials
// (setresuid) is seen with the new ones at once.
func TestCallerCredentialsNotCached(t *testing.T) {
	ctx := func(uid uint32) *fuse.Context {
		return &fuse.Context{Caller: fuse.Caller{Owner: fuse.Owner{Uid: uid, Gid: uid + 1}, Pid: uint32(os.Getpid())}}
	}
	first := callerOf(ctx(uidAlice))
	if first.pid() != os.Getpid() {
		t.Fatalf("pid = %d, want %d", first.pid(), os.Getpid())
	}
	second := callerOf(ctx(uidBob))
	if second.uid != uidBob || second.gid != uidBob+1 || second.pid() != os.Getpid() {
		t.Errorf("after the credential change the caller is uid %d gid %d pid %d, want %d %d %d",
			second.uid, second.gid, second.pid(), uidBob, uidBob+1, os.Getpid())
	}
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A process's leader is cached without reading /proc, and its entry goes
// when the process has exited.
func TestThreadGroupsLeader(t *testing.T) {
	g := &threadGroups{max: 8}
	t.Cleanup(func() { g.closeAll() })
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if got := g.tgid(pid); got != pid {
		t.Fatalf("tgid(leader %d) = %d", pid, got)
	}
	if e := g.entries[pid]; e == nil || e.tgid != pid {
		t.Fatalf("leader entry %+v, want one for %d", e, pid)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if got := g.tgid(pid); got != pid {
		t.Errorf("tgid(exited %d) = %d, want itself", pid, got)
	}
	if e := g.entries[pid]; e != nil && !threadAlive(e.fd) {
		t.Errorf("the entry of exited process %d is kept", pid)
	}
}

// BenchmarkTgid compares the ways to a caller's process id: a cache hit,
// a miss on a leader (one pidfd_open), a miss on another thread (pidfd
// and a read of /proc/<tid>/status), and the read alone.
func BenchmarkTgid(b *testing.B) {
	b.Run("hit", func(b *testing.B) {
		g := &threadGroups{max: 8}
		defer g.closeAll()
		g.tgid(os.Getpid())
		for b.Loop() {
			g.tgid(os.Getpid())
		}
	})
	b.Run("miss-leader", func(b *testing.B) {
		g := &threadGroups{max: 8}
		defer g.closeAll()
		for b.Loop() {
			g.tgid(os.Getpid())
			g.closeAll()
		}
	})
	b.Run("miss-thread", func(b *testing.B) {
		g := &threadGroups{max: 8}
		defer g.closeAll()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid := unix.Gettid()
		for b.Loop() {
			g.tgid(tid)
			g.closeAll()
		}
	})
	b.Run("read", func(b *testing.B) {
		for b.Loop() {
			readTgid(os.Getpid())
		}
	})
}
