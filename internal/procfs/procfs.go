// Package procfs reads what leasefs needs to know of processes and of this
// machine from the proc filesystem (proc(5)): the boot id and host name a
// lease records, a process's start time (which with its pid names one
// process across pid reuse, docs/PROTOCOL.md §5 rule 2), whether it is
// gone, whether it has a SIGKILL pending, and its children. Every function
// is safe for concurrent use; none caches what can change.
package procfs

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// bootID reads the boot id once per process; it cannot change while the
// process runs.
var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

// BootID returns this machine's boot id, the trimmed content of
// /proc/sys/kernel/random/boot_id (a UUID that changes at every boot), or
// "" when it cannot be read (not Linux, no /proc). It is read once per
// process.
func BootID() string { return bootID() }

// Hostname returns the host name reported by [os.Hostname], or
// "unknown-host" when it fails or is empty. It is not cached: the host name
// can change.
func Hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "unknown-host"
	}
	return h
}

// StartTicks returns the start time of process pid in clock ticks since
// boot (field 22 of /proc/<pid>/stat, proc(5)), which with the pid names
// one process across pid reuse. ok is false when the process does not
// exist, has exited but not been reaped (a zombie), or /proc cannot be
// read.
func StartTicks(pid int) (ticks uint64, ok bool) {
	fields, ok := statFields(pid)
	// fields[0] is field 3 (state); field 22 is fields[19]. A zombie (Z)
	// or dead (X) process has exited: only its parent has not reaped it.
	if !ok || len(fields) < 20 || exited(fields[0]) {
		return 0, false
	}
	ticks, err := strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return 0, false
	}
	return ticks, true
}

// Exited reports whether process pid has exited: it is gone, or a zombie
// waiting to be reaped (state Z or X in /proc/<pid>/stat).
func Exited(pid int) bool { return ExitedIn("/proc", pid) }

// ExitedIn is [Exited] for the proc filesystem mounted at root (a test's
// fake one, or another pid namespace's).
func ExitedIn(root string, pid int) bool {
	fields, ok := statFieldsIn(root, pid)
	return !ok || len(fields) == 0 || exited(fields[0])
}

func exited(state []byte) bool {
	return bytes.Equal(state, []byte("Z")) || bytes.Equal(state, []byte("X"))
}

// statFields returns the fields of /proc/<pid>/stat from field 3 (state)
// on.
func statFields(pid int) ([][]byte, bool) { return statFieldsIn("/proc", pid) }

// statFieldsIn is statFields for the proc filesystem at root.
func statFieldsIn(root string, pid int) ([][]byte, bool) {
	if pid <= 0 {
		return nil, false
	}
	data, err := os.ReadFile(root + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, false
	}
	// The command name (field 2) is in parentheses and may contain spaces
	// and parentheses: the fields after it start after the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return nil, false
	}
	return bytes.Fields(data[i+1:]), true
}

// Gone reports whether the process recorded as (pid, startTicks) is
// certainly gone: no process has that pid, it has exited (a zombie), or
// the pid now belongs to a process that started at another time (reuse).
// startTicks 0 (unknown) checks existence only. A pid of 0 or less is
// never gone. docs/PROTOCOL.md §5 rule 2.
func Gone(pid int, startTicks uint64) bool {
	if pid <= 0 {
		return false
	}
	ticks, ok := StartTicks(pid)
	if !ok {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			return true // a zombie: exited, not yet reaped
		}
		// /proc unreadable for this pid: ask the kernel directly.
		err := syscall.Kill(pid, 0)
		return errors.Is(err, syscall.ESRCH)
	}
	return startTicks != 0 && ticks != startTicks
}

// KillPending reports whether process pid has a SIGKILL pending: it has
// been killed but has not exited, because one of its threads is blocked in
// the kernel (proc(5): SigPnd, ShdPnd of /proc/<pid>/status).
func KillPending(pid int) bool {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || (key != "SigPnd" && key != "ShdPnd") {
			continue
		}
		mask, err := strconv.ParseUint(strings.TrimSpace(val), 16, 64)
		if err == nil && mask&(1<<(unix.SIGKILL-1)) != 0 {
			return true
		}
	}
	return false
}

// Children returns the children of every thread of process pid
// (/proc/<pid>/task/<tid>/children), nil when there are none or they cannot
// be read.
func Children(pid int) []int {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	var out []int
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for f := range strings.FieldsSeq(string(data)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}
