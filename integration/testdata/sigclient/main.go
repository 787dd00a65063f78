// Command sigclient runs lease cycles on a leasefs mount while signals
// interrupt its system calls, and counts every call that failed
// (docs/PROTOCOL.md §3, "Interrupted calls"): the Go runtime preempts its
// goroutines with SIGURG, and an interval timer adds SIGALRM, so the
// kernel sends FUSE_INTERRUPT for many of the requests in flight.
//
// Usage:
//
//	sigclient M DURATION GOROUTINES TIMER
//
// M is the lease directory, DURATION how long to run (a time.Duration),
// GOROUTINES how many goroutines loop at once, TIMER the interval of
// ITIMER_REAL (0 for none). Every goroutine i loops over a token lease
// cycle on go<i> (O_EXCL create, read the token, renew by writing it,
// stat, read the status document, close, unlink) and a handle cycle
// (open O_CREAT, flock, unlock, close), alternately on its own name
// go<i>-h and on the name go-shared that all goroutines contend for with
// a blocking flock.
//
// It prints KEY=VALUE lines: calls=N, failed=N, and fail.OP.ERRNO=N for
// each kind of failure, then the first failures in full; it exits 0.
package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: sigclient M DURATION GOROUTINES TIMER")
		os.Exit(2)
	}
	dur, err1 := time.ParseDuration(os.Args[2])
	n, err2 := strconv.Atoi(os.Args[3])
	timer, err3 := time.ParseDuration(os.Args[4])
	if err := errors.Join(err1, err2, err3); err != nil {
		fmt.Fprintln(os.Stderr, "sigclient:", err)
		os.Exit(2)
	}
	if timer > 0 {
		// Go's handlers use SA_RESTART; the channel only keeps the
		// default action (termination) away.
		signal.Notify(make(chan os.Signal, 1), syscall.SIGALRM)
		tv := unix.NsecToTimeval(timer.Nanoseconds())
		if _, err := unix.Setitimer(unix.ItimerReal, unix.Itimerval{Interval: tv, Value: tv}); err != nil {
			fmt.Fprintln(os.Stderr, "sigclient: setitimer:", err)
			os.Exit(1)
		}
	}
	var c counts
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			own := filepath.Join(os.Args[1], fmt.Sprintf("go%d", i))
			for k := 0; time.Now().Before(deadline); k++ {
				c.tokenCycle(own)
				if k%2 == 0 {
					c.handleCycle(own + "-h")
				} else {
					c.handleCycle(filepath.Join(os.Args[1], "go-shared"))
				}
			}
		})
	}
	wg.Wait()
	c.print()
}

// counts tallies calls and failures. Safe for concurrent use.
type counts struct {
	mu     sync.Mutex
	calls  int
	failed map[string]int
	first  []string
}

// call records one system call's outcome.
func (c *counts) call(op, name string, err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if err == nil {
		return true
	}
	if c.failed == nil {
		c.failed = map[string]int{}
	}
	errno := "other"
	var en syscall.Errno
	if errors.As(err, &en) {
		errno = unix.ErrnoName(en)
	}
	c.failed[op+"."+errno]++
	if len(c.first) < 20 {
		c.first = append(c.first, fmt.Sprintf("%s %s: %v", op, name, err))
	}
	return false
}

// tokenCycle reserves p, reads its token, renews, stats, reads the status
// document and releases.
func (c *counts) tokenCycle(p string) {
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR, 0o644)
	if !c.call("create", p, err) {
		return
	}
	buf := make([]byte, 4096)
	n, err := unix.Read(fd, buf)
	c.call("read-token", p, err)
	c.call("close", p, unix.Close(fd))
	tok := bytes.TrimSpace(buf[:max(n, 0)])
	if w, err := unix.Open(p, unix.O_WRONLY, 0); c.call("open-renew", p, err) {
		_, err = unix.Write(w, append(tok, '\n'))
		c.call("renew", p, err)
		c.call("close", p, unix.Close(w))
	}
	var st unix.Stat_t
	c.call("stat", p, unix.Stat(p, &st))
	if r, err := unix.Open(p, unix.O_RDONLY, 0); c.call("open-cat", p, err) {
		for {
			n, err := unix.Read(r, buf)
			if !c.call("cat", p, err) || n == 0 {
				break
			}
		}
		c.call("close", p, unix.Close(r))
	}
	c.call("unlink", p, unix.Unlink(p))
}

// handleCycle takes a handle lease on p with a blocking flock and ends it.
func (c *counts) handleCycle(p string) {
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_RDWR, 0o644)
	if !c.call("open-lock", p, err) {
		return
	}
	if c.call("flock", p, unix.Flock(fd, unix.LOCK_EX)) {
		c.call("unlock", p, unix.Flock(fd, unix.LOCK_UN))
	}
	c.call("close", p, unix.Close(fd))
}

func (c *counts) print() {
	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	keys := make([]string, 0, len(c.failed))
	for k, v := range c.failed {
		total += v
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Printf("calls=%d\nfailed=%d\n", c.calls, total)
	for _, k := range keys {
		fmt.Printf("fail.%s=%d\n", k, c.failed[k])
	}
	for _, f := range c.first {
		fmt.Println("#", f)
	}
}
