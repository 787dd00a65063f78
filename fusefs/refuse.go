package fusefs

import (
	"context"
	"fmt"
	"log/slog"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/internal/refusal"
)

// maxLogReason bounds the reason in a refusal's log line, so that hostile
// input cannot flood the log.
const maxLogReason = 256

// refusalLog writes the log line of every refused operation, naming the
// operation, resource, caller and reason (docs/PROTOCOL.md §3, §8b), and
// reports it to onRefuse when set ([Options.OnRefuse]). By its
// [refusal.Kind]: a conflict (a try-lock or O_EXCL create of a held name)
// is an expected outcome, logged at DEBUG as "conflict"; a failure of the
// store is a warning, "refused", every time; misuse is a warning,
// "refused", at most as many a second per caller uid as limit allows (no
// limit when nil), the caller's next line saying in "suppressed" how many
// were left out. Safe for concurrent use.
type refusalLog struct {
	log      *slog.Logger
	onRefuse func(op string, errno syscall.Errno)
	limit    *refusal.Limiter
}

// newRefusalLog returns the refusal log of a filesystem: lines to log,
// calls to onRefuse, warnings limited per uid with the defaults of
// [refusal.Options].
func newRefusalLog(log *slog.Logger, onRefuse func(op string, errno syscall.Errno)) refusalLog {
	return refusalLog{log: log, onRefuse: onRefuse, limit: refusal.NewLimiter(refusal.Options{})}
}

// refuse logs the refusal of op on resource by c, reports it and returns
// errno.
func (r refusalLog) refuse(op, resource string, c caller, errno syscall.Errno, reason any) syscall.Errno {
	level, msg, logged, suppressed := slog.LevelWarn, "refused", true, 0
	switch refusal.Classify(errno) {
	case refusal.Conflict:
		level, msg = slog.LevelDebug, "conflict"
	case refusal.Misuse:
		logged, suppressed = r.allow(c.uid)
	}
	if logged && r.log.Enabled(context.Background(), level) {
		attrs := []any{"op", op, "resource", resource, "pid", c.logPID(), "uid", c.uid,
			"errno", errnoName(errno), "reason", logReason(reason)}
		if suppressed > 0 {
			attrs = append(attrs, "suppressed", suppressed)
		}
		r.log.Log(context.Background(), level, msg, attrs...)
	}
	if r.onRefuse != nil {
		r.onRefuse(op, errno)
	}
	return errno
}

// allow reports whether uid may log a warning now, and how many of its
// warnings were left out since its last one.
func (r refusalLog) allow(uid uint32) (bool, int) {
	if r.limit == nil {
		return true, 0
	}
	return r.limit.Allow(uid)
}

// logReason renders a refusal's reason for its log line, cut to
// maxLogReason bytes.
func logReason(reason any) string {
	why := fmt.Sprint(reason)
	if len(why) > maxLogReason {
		why = why[:maxLogReason] + "…"
	}
	return why
}

// errnoName renders errno as its symbolic name, e.g. "EACCES".
func errnoName(e syscall.Errno) string {
	if name := unix.ErrnoName(e); name != "" {
		return name
	}
	return fmt.Sprintf("errno %d", int(e))
}
