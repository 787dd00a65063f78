package mount

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/internal/procfs"
)

// MountpointError reports a mountpoint that cannot be mounted on because it
// does not exist, is not a directory or cannot be examined. It unwraps to
// the cause: [fs.ErrNotExist], [syscall.ENOTDIR], [fs.ErrPermission]….
type MountpointError struct {
	Path string
	Err  error
}

// Error says what is wrong with the mountpoint.
func (e *MountpointError) Error() string {
	switch {
	case errors.Is(e.Err, fs.ErrNotExist):
		return "mount: mountpoint " + e.Path + " does not exist"
	case errors.Is(e.Err, syscall.ENOTDIR):
		return "mount: mountpoint " + e.Path + " is not a directory"
	}
	var pe *fs.PathError
	if errors.As(e.Err, &pe) {
		return "mount: mountpoint " + e.Path + ": " + pe.Err.Error()
	}
	return "mount: mountpoint " + e.Path + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *MountpointError) Unwrap() error { return e.Err }

// checkMountpoint checks that mp is a directory. The root of a FUSE mount on
// mp passes unexamined: its daemon may be stopped or dying and never answer
// the stat (the caller deals with such a mount once it holds the daemon
// lock), and so does a mountpoint left by a crashed daemon (ENOTCONN).
func checkMountpoint(mp string) error {
	if m, ok := procfs.MountedAt(procfs.Mounts(), mp); ok && strings.HasPrefix(m.FSType, "fuse") {
		return nil
	}
	st, err := os.Stat(mp)
	switch {
	case errors.Is(err, unix.ENOTCONN):
		return nil
	case err != nil:
		return &MountpointError{Path: mp, Err: err}
	case !st.IsDir():
		return &MountpointError{Path: mp, Err: syscall.ENOTDIR}
	}
	return nil
}

// CheckPaths makes the checks [Run] makes before it creates anything, for
// a caller that creates files in the state directory before it runs the
// daemon: the mountpoint must be a directory and the state directory must
// neither nest with it nor lie in a leasefs mount. Errors: a
// *[MountpointError]; [ErrInsideState].
func CheckPaths(mountpoint, stateDir string) error {
	_, _, err := checkPaths(mountpoint, stateDir)
	return err
}

// checkPaths is [CheckPaths]; it returns the absolute mountpoint and state
// directory.
func checkPaths(mountpoint, stateDir string) (mp, state string, err error) {
	if mp, err = filepath.Abs(mountpoint); err != nil {
		return "", "", err
	}
	if state, err = filepath.Abs(stateDir); err != nil {
		return "", "", err
	}
	if nested(state, mp) {
		return "", "", fmt.Errorf("%w: %s and %s", ErrInsideState, mp, state)
	}
	mounts := procfs.Mounts()
	if m, ok := procfs.ContainingMount(mounts, state); ok && m.FSType == fsType {
		return "", "", fmt.Errorf("%w: %s is inside the leasefs mount %s", ErrInsideState, state, m.Point)
	}
	// A leasefs mount on mp itself is a stale or live mount of its own,
	// handled later; one on an ancestor would have the new mount stack on
	// its namespace.
	if m, ok := procfs.ContainingMount(mounts, mp); ok && m.FSType == fsType && m.Point != mp {
		return "", "", fmt.Errorf("%w: %s is inside the leasefs mount %s", ErrInsideMount, mp, m.Point)
	}
	if err := checkMountpoint(mp); err != nil {
		return "", "", err
	}
	return mp, state, nil
}

// unmount unmounts mp, detaching it lazily when it is busy, and reports
// whether it did so: open files then keep the detached mount, and their
// leases outlive this daemon (docs/PROTOCOL.md §2).
func unmount(server *fuse.Server, mp string, root bool, log *slog.Logger) (lazy bool) {
	err := server.Unmount()
	if err == nil {
		return false
	}
	log.Info("mount busy; detaching lazily: its open files keep their leases", "mountpoint", mp, "err", err)
	if err := detach(mp, root); err != nil {
		log.Error("lazy unmount failed", "mountpoint", mp, "err", err)
	}
	return true
}

// detach lazily unmounts mp: umount2(MNT_DETACH) as root, fusermount3 -u -z
// otherwise.
func detach(mp string, root bool) error {
	if root {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("umount %s: %w", mp, err)
		}
		return nil
	}
	out, err := exec.Command("fusermount3", "-u", "-z", mp).CombinedOutput()
	if err != nil {
		return fmt.Errorf("fusermount3 -u -z %s: %w: %s", mp, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// cleanStale detaches a mount left on mp by a daemon that died: stat fails
// with ENOTCONN ("transport endpoint is not connected", docs/PROTOCOL.md
// §2). The caller holds the state directory's daemon lock, so the dead
// daemon was ours or served another state directory and is gone either way.
func cleanStale(mp string, log *slog.Logger) error {
	_, err := os.Stat(mp)
	if !errors.Is(err, unix.ENOTCONN) {
		return nil
	}
	log.Warn("detaching stale mount left by a dead daemon", "mountpoint", mp)
	return detach(mp, os.Geteuid() == 0)
}

// refuseLiveMount fails with [ErrMounted] when a leasefs mount whose daemon
// answers is on mp (a stale one, whose daemon died, answers ENOTCONN and is
// cleanStale's). The caller holds the daemon lock of its state directory or
// has none yet, so the mount is another state directory's.
func refuseLiveMount(mp string) error {
	m, ok := procfs.MountedAt(procfs.Mounts(), mp)
	if !ok || m.FSType != fsType {
		return nil
	}
	if _, err := os.Stat(mp); errors.Is(err, unix.ENOTCONN) {
		return nil
	}
	return fmt.Errorf("%w: %s is served by a live daemon of another state directory; unmount it first", ErrMounted, mp)
}

// nested reports whether a and b are the same directory or one contains the
// other.
func nested(a, b string) bool {
	inside := func(child, parent string) bool {
		rel, err := filepath.Rel(parent, child)
		return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
	}
	return inside(a, b) || inside(b, a)
}
