package fusefs

import (
	"bytes"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// maxThreadGroups bounds the [threadGroups] cache, and so the pidfds this
// process keeps open for it.
const maxThreadGroups = 256

// threads is the process's map from thread id to process id. The mapping is
// a fact of the pid namespace, not of one mount, so every [FS] of the
// process shares it.
var threads = threadGroups{max: maxThreadGroups}

// threadGroups maps thread ids to their process (thread group) ids, the
// "Tgid:" line of /proc/<tid>/status (proc(5)), and caches the answer: a
// FUSE request names the calling thread, and a process making many
// requests would otherwise cost a read of that file each
// (docs/ARCHITECTURE.md, kernel facts).
//
// Each entry keeps a pidfd (pidfd_open(2)) and is used only while that
// pidfd does not poll readable. For a thread group's leader it is a process
// pidfd, readable once the whole group has exited: until then the leader
// holds its id, even as a zombie. For any other thread it is a thread pidfd
// (PIDFD_THREAD), readable once that thread has exited: a living thread
// keeps its id, and never changes its thread group (an execve(2) by a
// non-leader makes it take the leader's id: its old id then belongs to an
// exited thread). So a hit is exact, and a reused thread id always misses.
// Without PIDFD_THREAD (before Linux 6.9) only leaders are cached.
// Credentials are never cached: uid and gid come with every request.
//
// Safe for concurrent use; its lock is a leaf, held for map operations
// only, never across a system call.
type threadGroups struct {
	max int // entries kept at most; 0 caches nothing

	mu      sync.Mutex
	entries map[int]*threadEntry
	noPidfd bool // PIDFD_THREAD is not supported: do not try again
}

// threadEntry is one cached thread. fd is closed once the entry has been
// dropped and no lookup is using it (refs is 0).
type threadEntry struct {
	tid     int
	tgid    int
	fd      int
	refs    int  // lookups polling fd now; guarded by threadGroups.mu
	dropped bool // removed from the map; guarded by threadGroups.mu
}

// tgid returns the process id of thread tid, or tid itself when it cannot
// be read (the thread has gone, or /proc is not readable); tid when tid <= 0.
func (g *threadGroups) tgid(tid int) int {
	if tid <= 0 {
		return tid
	}
	if e := g.acquire(tid); e != nil {
		alive := threadAlive(e.fd)
		g.release(e, !alive)
		if alive {
			return e.tgid
		}
	}
	return g.resolve(tid)
}

// acquire returns the cache entry of tid with a reference taken, or nil.
func (g *threadGroups) acquire(tid int) *threadEntry {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entries[tid]
	if e != nil {
		e.refs++
	}
	return e
}

// release gives back a reference taken by acquire, dropping the entry first
// when stale.
func (g *threadGroups) release(e *threadEntry, stale bool) {
	g.mu.Lock()
	e.refs--
	if stale {
		g.dropLocked(e)
	}
	fd := g.closableLocked(e)
	g.mu.Unlock()
	closeFD(fd)
}

// resolve finds the process id of tid and caches it. A thread group's
// leader, the thread of every single-threaded process, is recognised
// without reading /proc: pidfd_open(2) without flags succeeds only for a
// process id, and that process pidfd, which polls readable once the whole
// group has exited, validates the entry (the leader's id stays taken while
// any thread of its group lives). Any other thread's id is read from
// /proc/<tid>/status and cached with a thread pidfd opened before the read,
// when that pidfd still shows the thread alive after it: the thread then
// held tid throughout the read.
func (g *threadGroups) resolve(tid int) int {
	if g.max <= 0 {
		if tgid, ok := readTgid(tid); ok {
			return tgid
		}
		return tid
	}
	switch fd, err := unix.PidfdOpen(tid, 0); err {
	case nil:
		g.store(tid, tid, fd)
		return tid
	case unix.ESRCH:
		return tid // gone
	}
	fd := g.openThreadPidfd(tid)
	tgid, ok := readTgid(tid)
	if !ok {
		closeFD(fd)
		return tid
	}
	g.store(tid, tgid, fd)
	return tgid
}

// store caches tgid as the process of tid, validated by pidfd fd, which it
// owns; it keeps nothing when fd is negative or already polls readable.
func (g *threadGroups) store(tid, tgid, fd int) {
	if fd < 0 || !threadAlive(fd) {
		closeFD(fd)
		return
	}
	g.mu.Lock()
	if g.entries == nil {
		g.entries = make(map[int]*threadEntry)
	}
	var closing []int
	if old := g.entries[tid]; old != nil {
		g.dropLocked(old)
		closing = append(closing, g.closableLocked(old))
	}
	if len(g.entries) >= g.max {
		// Evict one entry: the map's iteration order is as good a
		// choice as any for a cache that only saves a read.
		for _, victim := range g.entries {
			g.dropLocked(victim)
			closing = append(closing, g.closableLocked(victim))
			break
		}
	}
	g.entries[tid] = &threadEntry{tid: tid, tgid: tgid, fd: fd}
	g.mu.Unlock()
	for _, fd := range closing {
		closeFD(fd)
	}
}

// dropLocked removes e from the map if it is still there. g.mu is held.
func (g *threadGroups) dropLocked(e *threadEntry) {
	if e.dropped {
		return
	}
	e.dropped = true
	if g.entries[e.tid] == e {
		delete(g.entries, e.tid)
	}
}

// closableLocked returns e's pidfd when it is dropped and unused, marking
// it closed, or -1. g.mu is held.
func (g *threadGroups) closableLocked(e *threadEntry) int {
	if !e.dropped || e.refs > 0 || e.fd < 0 {
		return -1
	}
	fd := e.fd
	e.fd = -1
	return fd
}

// openThreadPidfd returns a thread pidfd of tid, or -1 when none can be
// had.
func (g *threadGroups) openThreadPidfd(tid int) int {
	g.mu.Lock()
	no := g.noPidfd
	g.mu.Unlock()
	if no {
		return -1
	}
	fd, err := unix.PidfdOpen(tid, unix.PIDFD_THREAD)
	if err == unix.EINVAL {
		// Before Linux 6.9 PIDFD_THREAD is an unknown flag (an id that
		// names no thread is ESRCH).
		g.mu.Lock()
		g.noPidfd = true
		g.mu.Unlock()
	}
	if err != nil {
		return -1
	}
	return fd
}

// closeAll empties the cache, closing its pidfds once no lookup uses
// them.
func (g *threadGroups) closeAll() {
	g.mu.Lock()
	var closing []int
	for _, e := range g.entries {
		g.dropLocked(e)
		closing = append(closing, g.closableLocked(e))
	}
	g.mu.Unlock()
	for _, fd := range closing {
		closeFD(fd)
	}
}

// len returns the number of cached threads.
func (g *threadGroups) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.entries)
}

// threadAlive reports whether pidfd fd does not poll readable: its thread
// (a thread pidfd) or its whole thread group (a process pidfd) has not
// exited (pidfd_open(2)).
func threadAlive(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == 0
	}
}

// closeFD closes fd unless it is negative.
func closeFD(fd int) {
	if fd >= 0 {
		_ = unix.Close(fd)
	}
}

// readTgid reads the "Tgid:" line of /proc/<tid>/status. It uses raw
// system calls: os.ReadFile's poller registration and stat double the cost
// of this read, which every miss of the cache pays.
func readTgid(tid int) (int, bool) {
	var buf [2048]byte // Tgid is on the fourth line, well within
	data, ok := readProc(tid, "status", buf[:])
	if !ok {
		return 0, false
	}
	i := bytes.Index(data, []byte("\nTgid:"))
	if i < 0 {
		return 0, false
	}
	line := data[i+len("\nTgid:"):]
	if j := bytes.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	n, err := strconv.Atoi(string(bytes.TrimSpace(line)))
	if err != nil || n <= 0 {
		return 0, false
	}
	return n, true
}

// readProc reads the start of /proc/<tid>/<name> into buf with one read(2)
// (a /proc file of one record is produced whole by its first read) and
// returns what was read.
func readProc(tid int, name string, buf []byte) ([]byte, bool) {
	fd, err := unix.Open("/proc/"+strconv.Itoa(tid)+"/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	defer unix.Close(fd)
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return nil, false
		}
		return buf[:n], true
	}
}
