package cli

import (
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/internal/procfs"
)

// stopTree stops the command and every process it started, once the lease
// is lost: SIGTERM to each, then, after grace (or at once if all are gone
// sooner), SIGKILL to whatever is left, again and again until nothing is
// left, so that a process forked meanwhile is killed too. exited is closed
// once the command itself has been reaped. Descendants are found through
// /proc; those the command left behind are this process's children (a
// child subreaper, prctl(2) PR_SET_CHILD_SUBREAPER), so none escapes by
// being orphaned.
func stopTree(exited <-chan struct{}, grace time.Duration) {
	self := os.Getpid()
	for _, pid := range descendants(self) {
		_ = unix.Kill(pid, unix.SIGTERM)
	}
	deadline := time.Now().Add(grace)
	for len(descendants(self)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	// A process in uninterruptible sleep dies only when it wakes: give up
	// on those after killLinger rather than spin.
	for left, until := descendants(self), time.Now().Add(killLinger); len(left) > 0 && time.Now().Before(until); left = descendants(self) {
		for _, pid := range left {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(time.Millisecond)
	}
	<-exited
}

// killLinger bounds how long stopTree keeps killing processes that are
// still alive after their SIGKILL.
const killLinger = 5 * time.Second

// descendants returns the live (not zombie) processes below pid, found
// through /proc/PID/task/TID/children (proc(5)).
func descendants(pid int) []int {
	var out []int
	for queue := procfs.Children(pid); len(queue) > 0; queue = queue[1:] {
		p := queue[0]
		if !procfs.Exited(p) {
			out = append(out, p)
		}
		queue = append(queue, procfs.Children(p)...)
	}
	return out
}

// reapOrphans reaps the children of this process that have exited, but for
// the command itself (cmdPID, which its exec.Cmd waits for): the processes
// the command left behind and that became this child subreaper's children.
func reapOrphans(cmdPID int) {
	for _, c := range procfs.Children(os.Getpid()) {
		if c != cmdPID {
			var ws unix.WaitStatus
			_, _ = unix.Wait4(c, &ws, unix.WNOHANG, nil)
		}
	}
}

// waitStatus renders how a process ended as a shell would: its exit code,
// or 128+N after signal N.
func waitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
