package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// roleEnv names the helper role a re-executed copy of this command plays
// ("holder", "memfs"); unset for the command itself.
const roleEnv = "LEASEFS_BENCH_ROLE"

// runRole runs a helper role in a re-executed copy of this command and
// returns its exit code.
func runRole(role string, args []string) int {
	var err error
	switch role {
	case "holder":
		err = holderMain(args)
	case "memfs":
		err = memfsMain(args)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", role, err)
		return 1
	}
	return 0
}

// holderMain opens args[0] with O_CREAT, takes flock(LOCK_EX) on it, prints
// "held" and keeps the lock until stdin closes or it is killed.
func holderMain(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: holder PATH")
	}
	fd, err := unix.Open(args[0], unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		return err
	}
	fmt.Println("held")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// selfCommand returns a command re-executing this program in role.
func selfCommand(role string, args ...string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), roleEnv+"="+role)
	return cmd, nil
}

// Holders of row 8 and 8g: flock(1) — what README's `flock -n NAME cmd`
// runs, a small C process — and this program (a Go process, whose death
// takes the kernel longer: it unmaps a larger address space before it
// closes its files).
const (
	holderFlock = "flock"
	holderGo    = "go"
)

// killRow is rows 8 and 8g, the method of integration's
// BenchmarkKillToGrant: per sample a holder process (of kind holder) flocks
// one name, a successor (a thread of this process) blocks in flock on it,
// checked through user.lease.waiters; the clock runs from just before
// SIGKILL of the holder until the successor's flock returns
// (docs/PROTOCOL.md §6). The note gives the median time until the holder
// was dead (a zombie: its files closed): the kernel's share, before the
// daemon hears of the death.
func (b *bench) killRow(id, name, mp, holder string) error {
	if !b.want(id, name) {
		return nil
	}
	p := filepath.Join(mp, "kill")
	lat := make([]time.Duration, 0, b.cfg.killN)
	var dead []time.Duration
	for range b.cfg.killN {
		if b.ctx.Err() != nil {
			return nil
		}
		d, z, err := killOnce(p, holder)
		if err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
		lat = append(lat, d)
		dead = append(dead, z)
	}
	r := row{id: id, name: name, p50: quantile(lat, 0.5), p99: quantile(lat, 0.99),
		note: fmt.Sprintf("%d samples, max %s; holder dead after %s (p50)", len(lat),
			fmtDur(quantile(lat, 1)), fmtDur(quantile(dead, 0.5)))}
	b.rows = append(b.rows, r)
	b.logf("%-3s %-44s p50 %s p99 %s %s", id, name, fmtDur(r.p50), fmtDur(r.p99), r.note)
	return nil
}

// killOnce runs one kill-to-grant sample on path p with a holder of kind
// holder. It returns the time until the successor was granted and the
// time until the holder was dead.
func killOnce(p, holder string) (granted, dead time.Duration, err error) {
	var cmd *exec.Cmd
	if holder == holderFlock {
		// -o: the lock is flock(1)'s alone, not its child's, so that
		// killing flock(1) frees it; the child says when it is held.
		cmd = exec.Command("flock", "-o", p, "sh", "-c", "echo held; exec cat")
	} else if cmd, err = selfCommand("holder", p); err != nil {
		return 0, 0, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, 0, err
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() }()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if strings.TrimSpace(s) != "held" {
			return 0, 0, fmt.Errorf("holder said %q; stderr: %s", s, stderr.String())
		}
	case <-time.After(10 * time.Second):
		return 0, 0, errors.New("holder did not lock within 10s")
	}

	type grant struct {
		at  time.Time
		fd  int
		err error
	}
	got := make(chan grant, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
		if err != nil {
			got <- grant{err: err}
			return
		}
		err = unix.Flock(fd, unix.LOCK_EX)
		got <- grant{at: time.Now(), fd: fd, err: err}
	}()
	if err := waitWaiters(p, 1, 10*time.Second); err != nil {
		return 0, 0, err
	}
	died := make(chan time.Time, 1)
	start := time.Now()
	go func() {
		// WNOWAIT: the deferred Wait reaps it.
		var info unix.Siginfo
		_ = unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		died <- time.Now()
	}()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	var g grant
	select {
	case g = <-got:
	case <-time.After(10 * time.Second):
		return 0, 0, errors.New("successor not granted 10s after SIGKILL of the holder")
	}
	if g.err != nil {
		return 0, 0, fmt.Errorf("successor: %w", g.err)
	}
	_ = unix.Flock(g.fd, unix.LOCK_UN)
	_ = unix.Close(g.fd)
	return g.at.Sub(start), (<-died).Sub(start), nil
}

// waitWaiters waits until the status field user.lease.waiters of p is n
// (docs/PROTOCOL.md §4.1).
func waitWaiters(p string, n int, timeout time.Duration) error {
	want := fmt.Sprint(n)
	buf := make([]byte, 32)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if m, err := unix.Getxattr(p, "user.lease.waiters", buf); err == nil && string(buf[:m]) == want {
			return nil
		}
		time.Sleep(200 * time.Microsecond)
	}
	return fmt.Errorf("%s: user.lease.waiters did not reach %d within %v", p, n, timeout)
}
