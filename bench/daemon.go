package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/internal/syncbuf"
	"golang.org/x/sys/unix"
)

// fuseMagic is the f_type statfs(2) reports for a FUSE filesystem.
const fuseMagic = 0x65735546

// child is a process the command started and must stop: a leasefs daemon
// or the in-memory FUSE server, with the mountpoint it serves. Its methods
// are safe for concurrent use.
type child struct {
	name   string
	cmd    *exec.Cmd
	mp     string // "" when it serves no mount
	exited chan struct{}
	logBuf syncbuf.Buffer // its stdout and stderr
}

func (c *child) log() string { return c.logBuf.String() }

// buildLeasefs builds the daemon from the module root into the temporary
// directory, once.
func (b *bench) buildLeasefs() (string, error) {
	if b.bin != "" {
		return b.bin, nil
	}
	bin := filepath.Join(b.tmp, "leasefs")
	b.logf("go build -o %s . (in %s)", bin, b.root)
	cmd := exec.CommandContext(b.ctx, "go", "build", "-o", bin, ".")
	cmd.Dir = b.root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	b.bin = bin
	return bin, nil
}

// spawn starts a child that will serve a FUSE mount on mp and registers
// its stop. The child gets its own process group (so Ctrl-C reaches only
// this command, which then stops it in order) and SIGTERM if this command
// dies first.
func (b *bench) spawn(name, mp string, cmd *exec.Cmd) (*child, error) {
	c := &child{name: name, cmd: cmd, mp: mp, exited: make(chan struct{})}
	cmd.Dir = "/"
	cmd.Stdout = &c.logBuf
	cmd.Stderr = &c.logBuf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		_ = cmd.Wait()
		close(c.exited)
	}()
	b.onClose(c.stop)
	return c, nil
}

// waitMounted waits until statfs of the child's mountpoint reports FUSE,
// which means the mount answers, and returns the time since spawned.
func (c *child) waitMounted(spawned time.Time, timeout time.Duration) (time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		var st unix.Statfs_t
		if err := unix.Statfs(c.mp, &st); err == nil && st.Type == fuseMagic {
			return time.Since(spawned), nil
		}
		select {
		case <-c.exited:
			return 0, fmt.Errorf("%s exited (%v) before mounting; log:\n%s", c.name, c.cmd.ProcessState, c.log())
		default:
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s not mounted after %v; log:\n%s", c.name, timeout, c.log())
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// stop ends the child (SIGTERM, then SIGKILL, then aborting its FUSE
// connection) and detaches anything still mounted on its mountpoint.
// Calling it again does nothing more.
func (c *child) stop() {
	select {
	case <-c.exited:
	default:
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			_ = c.cmd.Process.Signal(syscall.SIGKILL)
			select {
			case <-c.exited:
			case <-time.After(3 * time.Second):
				abortConnection(c.mp)
				<-c.exited
			}
		}
	}
	if c.mp != "" {
		detach(c.mp)
	}
}

// detach lazily unmounts every mount stacked on mp.
func detach(mp string) {
	for range 8 {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
			return // EINVAL: not a mountpoint any more
		}
	}
}

// abortConnection aborts the FUSE connection mounted on mp through
// /sys/fs/fuse/connections/<minor>/abort, for a server that no longer
// answers.
func abortConnection(mp string) {
	for _, m := range procfs.Mounts() {
		if m.Point == mp && m.Minor != "" {
			_ = os.WriteFile(filepath.Join("/sys/fs/fuse/connections", m.Minor, "abort"), []byte("1"), 0o200)
		}
	}
}

// leasefsDaemon is a running "leasefs mount" with its paths.
type leasefsDaemon struct {
	*child
	state string
	pid   int
}

// startLeasefs builds the daemon if needed, starts "leasefs mount --state
// state mp" with extra flags and waits until the mount answers. It returns
// the daemon and how long it took from spawn to a FUSE statfs.
func (b *bench) startLeasefs(state, mp string, extra ...string) (*leasefsDaemon, time.Duration, error) {
	bin, err := b.buildLeasefs()
	if err != nil {
		return nil, 0, err
	}
	if err := os.MkdirAll(mp, 0o755); err != nil {
		return nil, 0, err
	}
	args := append([]string{"mount", "--state", state}, extra...)
	args = append(args, mp)
	spawned := time.Now()
	c, err := b.spawn("leasefs mount", mp, exec.Command(bin, args...))
	if err != nil {
		return nil, 0, err
	}
	took, err := c.waitMounted(spawned, 60*time.Second)
	if err != nil {
		c.stop()
		return nil, 0, err
	}
	return &leasefsDaemon{child: c, state: state, pid: c.cmd.Process.Pid}, took, nil
}

// rssBytes returns VmRSS of pid from /proc/PID/status (proc(5)).
func rssBytes(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb * 1024, err
			}
		}
	}
	return 0, errors.New("no VmRSS line")
}
