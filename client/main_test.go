package client_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The daemon the examples and tests run against: a real "leasefs mount" of
// a fresh state directory, built from this module (with -race when the
// tests are).
var (
	// mnt is the mountpoint: /mnt/leases in the examples' prose.
	mnt string
	// state is the daemon's state directory; bin the leasefs binary.
	state, bin string
	// daemon is the running daemon, replaced by restartDaemon.
	daemon *daemonProc
)

// leaseDuration is the daemon's --lease-duration: short, so that a test of
// renewals sees several.
const leaseDuration = 2 * time.Second

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		if os.Getenv("LEASEFS_REQUIRE_FUSE") == "1" {
			fmt.Fprintln(os.Stderr, "client: LEASEFS_REQUIRE_FUSE=1 but /dev/fuse is missing:", err)
			return 1
		}
		fmt.Fprintln(os.Stderr, "client: no /dev/fuse; skipping the tests that need a mount")
		return 0
	}
	dir, err := os.MkdirTemp("", "leasefs-client-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin = filepath.Join(dir, "leasefs")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "github.com/leasefs/leasefs")...)
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "client: go build: %v\n%s", err, out)
		return 1
	}
	mnt, state = filepath.Join(dir, "mnt"), filepath.Join(dir, "state")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		return 1
	}
	if daemon, err = startDaemon(); err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		return 1
	}
	code := m.Run()
	if err := daemon.stop(); err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		code = 1
	}
	return code
}

// daemonProc is a running "leasefs mount".
type daemonProc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stderr bytes.Buffer
	exited chan struct{}
}

// startDaemon starts leasefs on mnt and state and waits for its
// msg=mounted line.
func startDaemon() (*daemonProc, error) {
	d := &daemonProc{exited: make(chan struct{})}
	d.cmd = exec.Command(bin, "mount", "--state", state, "--lease-duration", leaseDuration.String(), mnt)
	// If the test binary dies, the daemon gets SIGTERM and unmounts.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	pr, err := d.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	mounted := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		once := sync.Once{}
		for sc.Scan() {
			d.mu.Lock()
			d.stderr.WriteString(sc.Text() + "\n")
			d.mu.Unlock()
			if strings.Contains(sc.Text(), "msg=mounted") {
				once.Do(func() { close(mounted) })
			}
		}
		_, _ = io.Copy(io.Discard, pr)
		_ = d.cmd.Wait()
		close(d.exited)
	}()
	select {
	case <-mounted:
		return d, nil
	case <-d.exited:
		return nil, fmt.Errorf("leasefs mount exited before mounting:\n%s", d.log())
	case <-time.After(20 * time.Second):
		_ = d.stop()
		return nil, fmt.Errorf("leasefs mount not mounted after 20s:\n%s", d.log())
	}
}

func (d *daemonProc) log() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stderr.String()
}

// stop sends SIGTERM to the daemon by its pid, waits for it, and detaches
// the mount if it is still there. It fails on a data race in its log.
func (d *daemonProc) stop() error {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
	_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
	if strings.Contains(d.log(), "WARNING: DATA RACE") {
		return errors.New("the race detector found a data race in leasefs mount:\n" + d.log())
	}
	return nil
}

// restartDaemon stops the daemon and starts another on the same state
// directory and mountpoint (docs/PROTOCOL.md §2).
func restartDaemon(t *testing.T) {
	t.Helper()
	if err := daemon.stop(); err != nil {
		t.Error(err)
	}
	d, err := startDaemon()
	if err != nil {
		t.Fatal(err)
	}
	daemon = d
}
