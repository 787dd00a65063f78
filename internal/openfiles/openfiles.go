// Package openfiles finds the processes that hold a descriptor of a given
// file of a given mount, from /proc/PID/fdinfo (proc(5)). A leasefs daemon
// uses it to learn which handle leases of a previous daemon still have an
// open file (docs/PROTOCOL.md §2, "Handle leases across restarts"): the
// kernel keeps a descriptor of a detached FUSE mount open after its daemon
// died, and its fdinfo keeps naming the old mount (mnt_id) and the lease's
// inode number (ino).
//
// Its functions are safe for concurrent use.
package openfiles

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"github.com/leasefs/leasefs/internal/procfs"
)

// Key names an open file by what its descriptor's fdinfo says: the mount it
// was opened on (mnt_id, the first field of /proc/PID/mountinfo) and its
// inode number (ino).
type Key struct {
	Mount int
	Ino   uint64
}

// String returns "mount 42 inode 1099511627777".
func (k Key) String() string { return fmt.Sprintf("mount %d inode %d", k.Mount, k.Ino) }

// Scan is the outcome of one pass over /proc.
type Scan struct {
	// Holders maps each open file of the asked-for mounts to the
	// processes (thread-group ids, ascending) holding a descriptor of it.
	Holders map[Key][]int
	// Unreadable are the processes (ascending pids) whose descriptors
	// could not be read (EACCES: another uid and the scanner is not root,
	// or a process it may not trace, such as a container's init without
	// CAP_SYS_PTRACE); their open files are unknown. Processes that exited
	// during the scan, zombies (which hold no descriptors) and the scanner
	// itself are not among them.
	Unreadable []int
}

// ErrNestedPIDNamespace is returned by [ScanMounts] when the scanner runs in
// a pid namespace other than the initial one: processes outside it are
// invisible in its /proc, so an open file found nowhere may still be held.
var ErrNestedPIDNamespace = errors.New("openfiles: this process is in a nested pid namespace: holders outside it cannot be seen")

// ScanMounts reads the fdinfo of every descriptor of every process in
// proc (normally "/proc") and returns the open files that are on one of
// mounts. skipUnreadable, when set, decides whether an unreadable process
// (given its uid) may be left out of [Scan.Unreadable]: a process that
// could never reach the mount. Errors: [ErrNestedPIDNamespace]; the error of
// reading proc's directory itself.
func ScanMounts(proc string, mounts []int, skipUnreadable func(uid int) bool) (Scan, error) {
	if nested, err := inNestedPIDNamespace(proc); err == nil && nested {
		return Scan{}, ErrNestedPIDNamespace
	}
	want := make(map[int]bool, len(mounts))
	for _, m := range mounts {
		want[m] = true
	}
	ents, err := os.ReadDir(proc)
	if err != nil {
		return Scan{}, fmt.Errorf("openfiles: %w", err)
	}
	sc := Scan{Holders: make(map[Key][]int)}
	if len(want) == 0 {
		return sc, nil
	}
	self, _ := os.Readlink(proc + "/self") // this process's pid, as proc names it
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		keys, err := processFiles(proc, pid, want)
		switch {
		case errors.Is(err, fs.ErrPermission):
			if e.Name() != self && !procfs.ExitedIn(proc, pid) && (skipUnreadable == nil || !skipUnreadable(ownerUID(proc, pid))) {
				sc.Unreadable = append(sc.Unreadable, pid)
			}
			continue
		case err != nil:
			continue // exited meanwhile
		}
		for k := range keys {
			sc.Holders[k] = append(sc.Holders[k], pid)
		}
	}
	return sc, nil
}

// Holds reports whether process pid (a process or thread id) has a
// descriptor of open file k. A process that is gone or cannot be read holds
// nothing.
func Holds(proc string, pid int, k Key) bool {
	keys, err := processFiles(proc, pid, map[int]bool{k.Mount: true})
	if err != nil {
		return false
	}
	_, ok := keys[k]
	return ok
}

// processFiles returns the open files of process pid on the mounts in want.
// Errors: fs.ErrPermission when its descriptors cannot be listed; another
// error when it is gone.
func processFiles(proc string, pid int, want map[int]bool) (map[Key]struct{}, error) {
	dir := proc + "/" + strconv.Itoa(pid) + "/fdinfo"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make(map[Key]struct{})
	for _, e := range ents {
		b, err := os.ReadFile(dir + "/" + e.Name())
		if err != nil {
			continue // closed meanwhile
		}
		if k, ok := parseFDInfo(b); ok && want[k.Mount] {
			out[k] = struct{}{}
		}
	}
	return out, nil
}

// parseFDInfo reads the mnt_id and ino lines of one fdinfo file
// ("pos:\t0\nflags:\t0100002\nmnt_id:\t42\nino:\t1099511627777\n").
func parseFDInfo(b []byte) (Key, bool) {
	var k Key
	var haveMount, haveIno bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() && !(haveMount && haveIno) {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		value = strings.TrimSpace(value)
		switch name {
		case "mnt_id":
			n, err := strconv.Atoi(value)
			k.Mount, haveMount = n, err == nil
		case "ino":
			n, err := strconv.ParseUint(value, 10, 64)
			k.Ino, haveIno = n, err == nil
		}
	}
	return k, haveMount && haveIno
}

// Comm returns the command name of process pid (/proc/PID/comm), or "" when
// it cannot be read.
func Comm(proc string, pid int) string {
	b, err := os.ReadFile(proc + "/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(b), "\n")
}

// ownerUID returns the real uid of process pid, or -1.
func ownerUID(proc string, pid int) int {
	b, err := os.ReadFile(proc + "/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				if uid, err := strconv.Atoi(f[0]); err == nil {
					return uid
				}
			}
		}
	}
	return -1
}

// inNestedPIDNamespace reports whether this process sees itself under more
// than one pid (the NSpid line of /proc/self/status lists one per
// namespace level).
func inNestedPIDNamespace(proc string) (bool, error) {
	b, err := os.ReadFile(proc + "/self/status")
	if err != nil {
		return false, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			return len(strings.Fields(rest)) > 1, nil
		}
	}
	return false, nil
}
