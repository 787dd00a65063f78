package leasecore

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
)

// ProcessStartTicks returns the start time of process pid in clock ticks
// since boot (field 22 of /proc/<pid>/stat, proc(5)), which with the pid
// identifies one process across pid reuse. ok is false when the process does
// not exist, has exited but not been reaped (a zombie), or /proc cannot be
// read. Safe for concurrent use.
func ProcessStartTicks(pid int) (ticks uint64, ok bool) {
	if pid <= 0 {
		return 0, false
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name (field 2) is in parentheses and may contain spaces
	// and parentheses: the fields after it start after the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, false
	}
	fields := bytes.Fields(data[i+1:])
	// fields[0] is field 3 (state); field 22 is fields[19]. A zombie (Z)
	// or dead (X) process has exited: only its parent has not reaped it.
	if len(fields) < 20 || bytes.Equal(fields[0], []byte("Z")) || bytes.Equal(fields[0], []byte("X")) {
		return 0, false
	}
	ticks, err = strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return 0, false
	}
	return ticks, true
}

// processGone reports whether the process recorded as (pid, startTicks) is
// certainly gone: no process has that pid, or the pid now belongs to a
// process that started at another time (reuse). startTicks 0 (unknown, e.g.
// a record of the reference store) checks existence only. docs/PROTOCOL.md §5 rule 2.
func processGone(pid int, startTicks uint64) bool {
	if pid <= 0 {
		return false
	}
	ticks, ok := ProcessStartTicks(pid)
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

// ProcessTgid maps a thread id to its process id (thread group id) through
// /proc/<tid>/status, because FUSE reports the calling thread. It returns tid
// itself when the mapping cannot be read. Safe for concurrent use.
func ProcessTgid(tid int) int {
	if tid <= 0 {
		return tid
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return tid
	}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("Tgid:")); ok {
			if n, err := strconv.Atoi(string(bytes.TrimSpace(v))); err == nil && n > 0 {
				return n
			}
		}
	}
	return tid
}
