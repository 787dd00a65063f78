package fusefs

import (
	"fmt"
	"log/slog"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxLogReason bounds the reason in a refusal's log line, so that hostile
// input cannot flood the log.
const maxLogReason = 256

// refusalLog writes the one log line of every refused operation, naming
// the operation, resource, caller and reason (docs/PROTOCOL.md §3), and
// reports it to onRefuse when set ([Options.OnRefuse]). Safe for
// concurrent use.
type refusalLog struct {
	log      *slog.Logger
	onRefuse func(op string, errno syscall.Errno)
}

// refuse logs the refusal of op on resource by c, reports it and returns
// errno.
func (r refusalLog) refuse(op, resource string, c caller, errno syscall.Errno, reason any) syscall.Errno {
	why := fmt.Sprint(reason)
	if len(why) > maxLogReason {
		why = why[:maxLogReason] + "…"
	}
	r.log.Warn("refused", "op", op, "resource", resource, "pid", c.logPID(), "uid", c.uid,
		"errno", errnoName(errno), "reason", why)
	if r.onRefuse != nil {
		r.onRefuse(op, errno)
	}
	return errno
}

// errnoName renders errno as its symbolic name, e.g. "EACCES".
func errnoName(e syscall.Errno) string {
	if name := unix.ErrnoName(e); name != "" {
		return name
	}
	return fmt.Sprintf("errno %d", int(e))
}
