// Command idioms loops over the open-and-lock idioms of Go lock libraries
// on a leasefs mount while signals interrupt its system calls: the Go
// runtime preempts goroutines with SIGURG, and a 1 ms interval timer adds
// SIGALRM, so the kernel sends FUSE_INTERRUPT for many requests in flight
// (docs/PROTOCOL.md §3, "Interrupted calls").
//
// Usage:
//
//	idioms IDIOM PATH ITERATIONS
//
// IDIOM is one of
//
//	trunc   open(O_RDWR|O_CREAT|O_TRUNC) + fstat + lseek(SEEK_END) +
//	        flock(LOCK_EX), blocking + close (the release is the close)
//	append  open(O_RDWR|O_CREAT|O_APPEND) + fstat + ftruncate(0) +
//	        fcntl(F_SETLK) whole-file write lock + F_UNLCK + close
//
// It prints ok=N (acquired), busy=N (F_SETLK refused as held), failed=N
// and fail.OP.ERRNO=N for each kind of failure, then the first failures in
// full; every iteration is one of ok, busy or a failure. It exits 0.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: idioms IDIOM PATH ITERATIONS")
		os.Exit(2)
	}
	idiom, path := os.Args[1], os.Args[2]
	n, err := strconv.Atoi(os.Args[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, "idioms:", err)
		os.Exit(2)
	}
	// Go's handlers use SA_RESTART; the channel keeps the default action
	// (termination) away.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGALRM)
	tv := unix.NsecToTimeval(time.Millisecond.Nanoseconds())
	if _, err := unix.Setitimer(unix.ItimerReal, unix.Itimerval{Interval: tv, Value: tv}); err != nil {
		fmt.Fprintln(os.Stderr, "idioms: setitimer:", err)
		os.Exit(1)
	}
	var t tally
	for range n {
		switch idiom {
		case "trunc":
			t.trunc(path)
		case "append":
			t.append(path)
		default:
			fmt.Fprintln(os.Stderr, "idioms: unknown idiom", idiom)
			os.Exit(2)
		}
	}
	t.print(os.Stdout)
}

// tally counts the outcomes of the iterations.
type tally struct {
	ok, busy int
	failed   map[string]int
	first    []string
}

// check records err of op, if any, as the iteration's failure and reports
// whether op succeeded.
func (t *tally) check(op string, err error) bool {
	if err == nil {
		return true
	}
	if t.failed == nil {
		t.failed = map[string]int{}
	}
	name := "other"
	var en syscall.Errno
	if errors.As(err, &en) {
		name = unix.ErrnoName(en)
	}
	t.failed[op+"."+name]++
	if len(t.first) < 10 {
		t.first = append(t.first, fmt.Sprintf("%s: %v", op, err))
	}
	return false
}

// trunc is the O_TRUNC open of a lock file, the calls a library makes
// right after it, and a blocking flock held until the close.
func (t *tally) trunc(path string) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o644)
	if !t.check("open", err) {
		return
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if !t.check("fstat", unix.Fstat(fd, &st)) {
		return
	}
	if _, err := unix.Seek(fd, 0, io.SeekEnd); !t.check("lseek", err) {
		return
	}
	if t.check("flock", unix.Flock(fd, unix.LOCK_EX)) {
		t.ok++
	}
}

// append is the O_APPEND open of a lock file, fstat and ftruncate, and a
// non-blocking whole-file fcntl write lock, unlocked before the close.
func (t *tally) append(path string) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_APPEND|unix.O_CLOEXEC, 0o644)
	if !t.check("open", err) {
		return
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if !t.check("fstat", unix.Fstat(fd, &st)) || !t.check("ftruncate", unix.Ftruncate(fd, 0)) {
		return
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	err = unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &lk)
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
		t.busy++
		return
	}
	if !t.check("fcntl-lock", err) {
		return
	}
	lk.Type = unix.F_UNLCK
	if t.check("fcntl-unlock", unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &lk)) {
		t.ok++
	}
}

func (t *tally) print(w io.Writer) {
	total := 0
	keys := make([]string, 0, len(t.failed))
	for k, v := range t.failed {
		total += v
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintf(w, "ok=%d\nbusy=%d\nfailed=%d\n", t.ok, t.busy, total)
	for _, k := range keys {
		fmt.Fprintf(w, "fail.%s=%d\n", k, t.failed[k])
	}
	for _, f := range t.first {
		fmt.Fprintln(w, "#", f)
	}
}
