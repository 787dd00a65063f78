package fusefs

import (
	"context"
	"log/slog"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/leasecore"
)

// nobody is the uid and gid assumed when a request carries no caller.
const nobody = 65534

// caller is the identity of the process behind a FUSE request: uid and gid
// as the request carries them, and the calling thread, mapped to its
// process only when asked ([caller.pid]).
type caller struct {
	uid, gid uint32
	tid      int       // the calling thread, 0 when unknown
	proc     *procMemo // the process of tid, resolved once; nil when tid is 0
}

// procMemo is the process id of a caller's thread, looked up at most once
// per request. Safe for concurrent use.
type procMemo struct {
	once sync.Once
	pid  int
}

// callerOf returns the caller of the request in ctx. FUSE reports the
// calling thread; it is mapped to its process (docs/ARCHITECTURE.md,
// kernel facts) when the process id is first needed. Pids identify for
// audit and liveness, never authorise.
func callerOf(ctx context.Context) caller {
	c, ok := fuse.FromContext(ctx)
	if !ok {
		// Never happens under go-fuse; fail closed as an unprivileged uid.
		return caller{uid: nobody, gid: nobody}
	}
	cl := caller{uid: c.Uid, gid: c.Gid, tid: int(c.Pid)}
	if cl.tid > 0 {
		cl.proc = new(procMemo)
	}
	return cl
}

// callerTID returns the thread behind the request in ctx, 0 when unknown:
// callerOf without the per-request process memo, for the lookup path.
func callerTID(ctx context.Context) int {
	if c, ok := fuse.FromContext(ctx); ok {
		return int(c.Pid)
	}
	return 0
}

// pid returns the process (thread group) id of the caller, 0 when unknown.
// Its first call per request may read /proc (see [threadGroups]).
func (c caller) pid() int {
	if c.proc == nil {
		return c.tid
	}
	c.proc.once.Do(func() { c.proc.pid = threads.tgid(c.tid) })
	return c.proc.pid
}

// logPID is the caller's pid for a log line, looked up only when the line
// is written.
func (c caller) logPID() slog.LogValuer { return pidValue(c) }

// pidValue renders a caller's process id in a log line.
type pidValue caller

// LogValue returns the process id.
func (p pidValue) LogValue() slog.Value { return slog.IntValue(caller(p).pid()) }

// mayHold reports whether c may act as the holder of l: the holder uid or
// root (docs/PROTOCOL.md §7).
func (c caller) mayHold(l leasecore.Lease) bool { return c.uid == 0 || c.uid == l.HolderUID }
