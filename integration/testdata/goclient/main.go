// Command goclient is the Go load generator of the reliability suite
// (integration/reliability_test.go): it loops over lease names, taking token
// leases (create, read the token, renew by writing it, complete) and handle
// leases (flock(2) and open-file-description fcntl locks), and logs every
// operation with CLOCK_MONOTONIC timestamps for the checker.
//
// Usage:
//
//	goclient mono    print "MONO_NS WALL_NS" (a clock helper for shell clients)
//	goclient run     run the loop; configured by the environment:
//	                 M (lease directory), NAMES (space separated), LEASE_MS,
//	                 LOG (log file, appended), MODES (comma separated: token,
//	                 flock, ofd), SEED
//
// Log lines (one write(2) each):
//
//	B seq op name mode lease gen mono wall    before the operation
//	E seq result lease gen mono extra         after it ("-" when unknown)
//
// op is acq, renew, check or rel; result is ok or an errno name; extra is the
// token read (acq of a token lease), the release action (rel: complete,
// abandon, unlock or close) or "-".
package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: goclient mono|run")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "mono":
		fmt.Println(mono(), time.Now().UnixNano())
	case "run":
		if err := run(); err != nil {
			fmt.Fprintln(os.Stderr, "goclient:", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintln(os.Stderr, "usage: goclient mono|run")
		os.Exit(2)
	}
}

// mono returns CLOCK_MONOTONIC in nanoseconds (system-wide, like Python's
// time.monotonic_ns).
func mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err)
	}
	return ts.Nano()
}

type client struct {
	dir   string
	names []string
	lease time.Duration
	modes []string
	log   *os.File
	seq   int
	rng   *rand.Rand
}

func run() error {
	c := &client{dir: os.Getenv("M"), names: strings.Fields(os.Getenv("NAMES")), modes: strings.Split(os.Getenv("MODES"), ",")}
	ms, err := strconv.Atoi(os.Getenv("LEASE_MS"))
	if err != nil || c.dir == "" || len(c.names) == 0 {
		return errors.New("the environment must set M, NAMES and LEASE_MS")
	}
	c.lease = time.Duration(ms) * time.Millisecond
	seed, _ := strconv.ParseUint(os.Getenv("SEED"), 10, 64)
	c.rng = rand.New(rand.NewPCG(seed, uint64(os.Getpid())))
	if c.log, err = os.OpenFile(os.Getenv("LOG"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err != nil {
		return err
	}
	for {
		name := c.names[c.rng.IntN(len(c.names))]
		switch mode := c.modes[c.rng.IntN(len(c.modes))]; mode {
		case "token":
			c.tokenCycle(name)
		case "flock", "ofd":
			c.handleCycle(name, mode)
		default:
			return fmt.Errorf("unknown mode %q", mode)
		}
		c.sleep(50, 250)
	}
}

func (c *client) sleep(minMS, maxMS int) {
	time.Sleep(time.Duration(minMS+c.rng.IntN(maxMS-minMS+1)) * time.Millisecond)
}

// begin logs the start of an operation and returns its sequence number.
func (c *client) begin(op, name, mode, lease string, gen uint64) int {
	c.seq++
	c.write(fmt.Sprintf("B %d %s %s %s %s %d %d %d\n", c.seq, op, name, mode, dash(lease), gen, mono(), time.Now().UnixNano()))
	return c.seq
}

// end logs the outcome of operation seq.
func (c *client) end(seq int, result, lease string, gen uint64, token string) {
	c.write(fmt.Sprintf("E %d %s %s %d %d %s\n", seq, result, dash(lease), gen, mono(), dash(token)))
}

func (c *client) write(line string) {
	if _, err := c.log.WriteString(line); err != nil {
		fmt.Fprintln(os.Stderr, "goclient: log:", err)
		os.Exit(1)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// errName returns the errno name of err ("ok" for nil).
func errName(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if name := unix.ErrnoName(errno); name != "" {
			if name == "EAGAIN" {
				return "EWOULDBLOCK"
			}
			return name
		}
		return "E" + strconv.Itoa(int(errno))
	}
	return "ERR"
}

var (
	leaseRE  = regexp.MustCompile(`(?m)^lease_id = "([^"]+)"$`)
	genRE    = regexp.MustCompile(`(?m)^generation = (\d+)$`)
	statusRE = regexp.MustCompile(`(?m)^status = "([^"]+)"$`)
	tokenRE  = regexp.MustCompile(`^hwl_[a-z2-7]{39}\n$`)
)

// status reads the status document through fd and returns the lease id and
// generation; errors: the read's errno, or "notactive"/"baddoc".
func status(fd int) (string, uint64, string) {
	buf := make([]byte, 8192)
	n, err := unix.Pread(fd, buf, 0)
	if err != nil {
		return "", 0, errName(err)
	}
	doc := string(buf[:n])
	l, g, s := leaseRE.FindStringSubmatch(doc), genRE.FindStringSubmatch(doc), statusRE.FindStringSubmatch(doc)
	if l == nil || g == nil || s == nil {
		return "", 0, "baddoc"
	}
	if s[1] != "active" {
		return l[1], 0, "notactive"
	}
	gen, _ := strconv.ParseUint(g[1], 10, 64)
	return l[1], gen, "ok"
}

func writeAll(fd int, p string) error {
	for {
		n, err := unix.Write(fd, []byte(p))
		if err == unix.EINTR {
			continue
		}
		if err == nil && n != len(p) {
			return unix.EIO
		}
		return err
	}
}

// gone reports whether result says the daemon went away under the operation.
func gone(result string) bool {
	return result == "ENOTCONN" || result == "ECONNABORTED" || result == "ENODEV"
}

func (c *client) tokenCycle(name string) {
	path := filepath.Join(c.dir, name)
	s := c.begin("acq", name, "token", "", 0)
	fd, err := unix.Open(path, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
	if err != nil {
		c.end(s, errName(err), "", 0, "")
		c.sleep(50, 200)
		return
	}
	defer func() { unix.Close(fd) }()
	buf := make([]byte, 4096)
	n, err := unix.Read(fd, buf)
	if err != nil {
		// Reserved, but the lease ended (or the daemon died) before its token
		// could be read: a holder that never knew its lease.
		c.end(s, "lost-"+errName(err), "", 0, "")
		return
	}
	tok := string(buf[:n])
	if !tokenRE.MatchString(tok) {
		c.end(s, "notoken", "", 0, "")
		return
	}
	tok = strings.TrimSuffix(tok, "\n")
	lease, gen, res := status(fd)
	if res != "ok" {
		c.end(s, "lost-"+res, lease, 0, tok)
		return
	}
	c.end(s, "ok", lease, gen, tok)
	lastOK := time.Now()
	hold := time.Now().Add(time.Duration(300+c.rng.IntN(1200)) * time.Millisecond)
	for time.Now().Before(hold) {
		c.sleep(100, 600)
		s := c.begin("renew", name, "token", lease, gen)
		err := writeAll(fd, tok+"\n")
		res := errName(err)
		c.end(s, res, lease, gen, "")
		switch {
		case err == nil:
			lastOK = time.Now()
			continue
		case res == "ESTALE":
			// A stalled holder's late renew: probe once more that the lease
			// stays dead, then give up.
			s := c.begin("renew", name, "token", lease, gen)
			c.end(s, errName(writeAll(fd, tok+"\n")), lease, gen, "")
			return
		case gone(res):
			nfd, ok := c.reopen(path, lease, lastOK)
			if !ok {
				return
			}
			unix.Close(fd)
			fd = nfd
			continue
		default:
			return
		}
	}
	switch r := c.rng.IntN(10); {
	case r == 0:
		return // walk away: the lease expires
	default:
		action := "complete"
		if r == 1 {
			action = "abandon"
		}
		s := c.begin("rel", name, "token", lease, gen)
		err := writeAll(fd, fmt.Sprintf("token = %q\naction = %q\n", tok, action))
		c.end(s, errName(err), lease, gen, action)
	}
}

// reopen finds the token lease again after the daemon restarted: it opens the
// name (without O_CREAT) until it answers, and keeps the descriptor if the
// name still holds lease. It gives up once the lease must have expired.
func (c *client) reopen(path, lease string, lastOK time.Time) (int, bool) {
	for time.Since(lastOK) < c.lease {
		time.Sleep(100 * time.Millisecond)
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			if gone(errName(err)) {
				continue
			}
			return -1, false
		}
		got, _, res := status(fd)
		if res == "ok" && got == lease {
			return fd, true
		}
		unix.Close(fd)
		if !gone(res) {
			return -1, false
		}
	}
	return -1, false
}

// handleCycle takes a handle lease with a non-blocking flock(2) or an
// open-file-description fcntl write lock, checks it while holding it, and
// releases it by unlocking or closing.
func (c *client) handleCycle(name, mode string) {
	path := filepath.Join(c.dir, name)
	s := c.begin("acq", name, mode, "", 0)
	// The open of a lock library: O_TRUNC and an ftruncate and fstat
	// after it every other cycle (docs/PROTOCOL.md §6, "Lock libraries").
	trunc := c.rng.IntN(2) == 0
	flags := unix.O_CREAT | unix.O_RDWR | unix.O_CLOEXEC
	if trunc {
		flags |= unix.O_TRUNC
	}
	fd, err := unix.Open(path, flags, 0o644)
	if err != nil {
		c.end(s, errName(err), "", 0, "")
		c.sleep(50, 200)
		return
	}
	if trunc {
		var st unix.Stat_t
		if err := errors.Join(unix.Ftruncate(fd, 0), unix.Fstat(fd, &st)); err != nil {
			unix.Close(fd)
			c.end(s, errName(err), "", 0, "")
			return
		}
	}
	closed := false
	defer func() {
		if !closed {
			unix.Close(fd)
		}
	}()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 0}
	if mode == "flock" {
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
	} else {
		err = unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk)
	}
	if err != nil {
		c.end(s, errName(err), "", 0, "")
		return
	}
	lease, gen, res := status(fd)
	if res != "ok" {
		c.end(s, "lost-"+res, lease, 0, "")
	} else {
		c.end(s, "ok", lease, gen, "")
		hold := time.Now().Add(time.Duration(200+c.rng.IntN(800)) * time.Millisecond)
		for time.Now().Before(hold) {
			c.sleep(100, 400)
			s := c.begin("check", name, mode, lease, gen)
			got, g, res := status(fd)
			if res == "ok" && (got != lease || g != gen) {
				res = "mismatch"
			}
			c.end(s, res, got, g, "")
			if res != "ok" {
				break
			}
		}
	}
	s = c.begin("rel", name, mode, lease, gen)
	action := "close"
	if c.rng.IntN(2) == 0 {
		action = "unlock"
		if mode == "flock" {
			err = unix.Flock(fd, unix.LOCK_UN)
		} else {
			lk.Type = unix.F_UNLCK
			err = unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk)
		}
	}
	cerr := unix.Close(fd)
	closed = true
	c.end(s, errName(errors.Join(err, cerr)), lease, gen, action)
}
