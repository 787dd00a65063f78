package client

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// flockChildEnv, set to "3" in a child's environment, makes the package's
// init take flock(LOCK_EX) on descriptor 3 and exit: 0 once locked, the
// errno otherwise (see the package doc, "Waiting").
const flockChildEnv = "LEASEFS_CLIENT_FLOCK"

func init() {
	if os.Getenv(flockChildEnv) == "3" {
		os.Exit(runFlockChild(3))
	}
}

// runFlockChild locks fd, waiting, and returns the exit code of the child.
func runFlockChild(fd int) int {
	if err := flockRetry(fd, unix.LOCK_EX); err != nil {
		var errno unix.Errno
		if errors.As(err, &errno) && errno > 0 && errno < 256 {
			return int(errno)
		}
		return int(unix.EIO)
	}
	return 0
}

// waitLock waits for flock(LOCK_EX) on fd in a child process that shares
// fd's open file description, so that ctx can end the wait by killing the
// child (the kernel then abandons its request). The lock, once the child
// took it, belongs to the open file; fd locks it again so that the lease's
// holder_pid names this process. Errors: ctx.Err(); the errno the child
// exits with; the error of starting it.
func waitLock(ctx context.Context, fd int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// The child's parent-death signal follows the thread that started it:
	// keep this goroutine on it until the child is gone.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// The child gets a duplicate of fd (the same open file description):
	// an *os.File of fd itself would close fd when it is collected.
	dup, err := unix.Dup(fd)
	if err != nil {
		return err
	}
	lease := os.NewFile(uintptr(dup), "lease")
	child := exec.Command("/proc/self/exe")
	child.Args = []string{os.Args[0]}
	child.Env = append(os.Environ(), flockChildEnv+"=3")
	child.ExtraFiles = []*os.File{lease}
	child.Stderr = os.Stderr
	child.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = child.Start()
	// Closing the duplicate sends only a FLUSH, which ends nothing.
	lease.Close()
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- child.Wait() }()
	select {
	case err := <-done:
		if code := child.ProcessState.ExitCode(); code > 0 && err != nil {
			return unix.Errno(code)
		}
		if err != nil {
			return err
		}
		return flockRetry(fd, unix.LOCK_EX|unix.LOCK_NB)
	case <-ctx.Done():
		_ = child.Process.Kill()
		<-done
		return ctx.Err()
	}
}
