package fusefs

import (
	"encoding/binary"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// openCalls maps the open system calls of this architecture to the index
// of their flags argument; -1 marks creat(2), which always creates.
// openat2(2) is handled apart: its flags are in a struct open_how.
var openCalls = map[uint64]int{unix.SYS_OPENAT: 2}

// callerCreates reports whether thread tid is blocked in an open system
// call with O_CREAT, read from /proc/<tid>/syscall (proc(5)): FUSE strips
// O_CREAT from the flags of an OPEN request, and an open that reaches a
// lease which ended after the kernel looked it up must know whether to
// reserve the name (docs/PROTOCOL.md §3). known is false when the call
// cannot be read: another kind of call (io_uring, a kernel worker), a
// thread this daemon may not inspect, or a thread that moved on.
func callerCreates(tid int) (creates, known bool) {
	if tid <= 0 {
		return false, false
	}
	var buf [512]byte // "nr arg0 … arg5 sp pc": at most 8 hex words
	data, ok := readProc(tid, "syscall", buf[:])
	if !ok {
		return false, false
	}
	fields := strings.Fields(string(data))
	if len(fields) < 7 {
		return false, false // "running", or a thread outside a system call
	}
	nr, err := strconv.ParseUint(fields[0], 10, 64)
	if err != nil {
		return false, false
	}
	arg := func(i int) (uint64, bool) {
		v, err := strconv.ParseUint(strings.TrimPrefix(fields[1+i], "0x"), 16, 64)
		return v, err == nil
	}
	if nr == unix.SYS_OPENAT2 {
		how, ok := arg(2)
		if !ok {
			return false, false
		}
		flags, ok := readUint64(tid, how)
		return ok && flags&unix.O_CREAT != 0, ok
	}
	i, ok := openCalls[nr]
	switch {
	case !ok:
		return false, false
	case i < 0:
		return true, true
	}
	flags, ok := arg(i)
	return ok && flags&unix.O_CREAT != 0, ok
}

// readUint64 reads the native-endian 64-bit word at addr in the memory of
// thread tid.
func readUint64(tid int, addr uint64) (uint64, bool) {
	fd, err := unix.Open("/proc/"+strconv.Itoa(tid)+"/mem", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	var b [8]byte
	if n, err := unix.Pread(fd, b[:], int64(addr)); err != nil || n != len(b) {
		return 0, false
	}
	return binary.NativeEndian.Uint64(b[:]), true
}
