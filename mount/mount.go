// Package mount runs the lifecycle of one leasefs mount (SPEC §2): the
// single-daemon lock on the state directory, stale-mount cleanup, the FUSE
// server (direct mount as root, fusermount3 otherwise), the reaper, and a
// clean unmount when the context ends.
package mount

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/fusefs"
	"github.com/leasefs/leasefs/leasecore"
)

// DaemonLockName is the file in the state directory on which the serving
// daemon holds an exclusive flock(2) (SPEC §2).
const DaemonLockName = "leasefs.lock"

// maxWrite is the largest FUSE write request: above [fusefs.MaxPayload], so
// that an oversized payload arrives whole and is refused with EFBIG.
const maxWrite = 128 << 10

// unmountWait bounds how long shutdown waits for open files to be released
// after a lazy unmount.
const unmountWait = 5 * time.Second

// Options configure [Run]. Mountpoint is required; every other zero field
// takes its default.
type Options struct {
	// Mountpoint is the directory to mount on; it must exist.
	Mountpoint string
	// StateDir holds the lease store; default [DefaultStateDir].
	StateDir string
	// LeaseDuration is the heartbeat TTL of token leases; default 5m.
	LeaseDuration time.Duration
	// HistoryKeep and MaxLeasesPerUID: see [leasecore.Options].
	HistoryKeep     int
	MaxLeasesPerUID int
	// AllowOther lets other users use the mount (SPEC §7).
	AllowOther bool
	// Logger receives the daemon's log; default slog.Default().
	Logger *slog.Logger
	// Debug logs every FUSE request (very verbose).
	Debug bool
}

// DefaultStateDir returns the embedded default state directory (SPEC §2):
// $LEASEFS_STATE; else /var/lib/leasefs for root; else
// $XDG_STATE_HOME/leasefs; else ~/.local/state/leasefs.
func DefaultStateDir() string {
	if d := os.Getenv("LEASEFS_STATE"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/lib/leasefs"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "leasefs")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = "."
	}
	return filepath.Join(home, ".local", "state", "leasefs")
}

// ErrInsideState is returned by [Run] when the mountpoint and the state
// directory are nested: the daemon would serve its own store through itself
// and deadlock (FUSE-NOTES.md).
var ErrInsideState = errors.New("mount: mountpoint and state directory must not be inside each other")

// Run mounts leasefs on opts.Mountpoint and serves it until ctx is done or
// the filesystem is unmounted from outside, then unmounts (lazily if busy)
// and returns. Errors: a *[leasecore.HeldError] when another daemon serves
// the state directory (naming it); [ErrInsideState]; mount and store
// errors. Run logs "mounted" once the mount is serving.
func Run(ctx context.Context, opts Options) error {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if opts.StateDir == "" {
		opts.StateDir = DefaultStateDir()
	}
	mp, err := filepath.Abs(opts.Mountpoint)
	if err != nil {
		return err
	}
	state, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		return fmt.Errorf("mount: create state directory: %w", err)
	}
	if nested(state, mp) {
		return fmt.Errorf("%w: %s and %s", ErrInsideState, mp, state)
	}

	lock, err := leasecore.AcquireFileLock(filepath.Join(state, DaemonLockName),
		leasecore.CurrentHolder("leasefs mount "+mp))
	if err != nil {
		return err
	}
	defer lock.Release()

	if err := cleanStale(mp, log); err != nil {
		return err
	}
	if st, err := os.Stat(mp); err != nil {
		return fmt.Errorf("mount: %w", err)
	} else if !st.IsDir() {
		return fmt.Errorf("mount: %s is not a directory", mp)
	}
	// Resolve symlinks only now that a stale mount cannot block the walk.
	if real, err := filepath.EvalSymlinks(mp); err == nil {
		mp = real
	}
	if real, err := filepath.EvalSymlinks(state); err == nil && nested(real, mp) {
		return fmt.Errorf("%w: %s and %s", ErrInsideState, mp, real)
	}

	store, err := leasecore.OpenFileStore(state, leasecore.Options{
		LeaseDuration:   opts.LeaseDuration,
		HistoryKeep:     opts.HistoryKeep,
		MaxLeasesPerUID: opts.MaxLeasesPerUID,
		Logger:          log,
	})
	if err != nil {
		return err
	}
	defer store.Close()

	lfs := fusefs.New(store, fusefs.Options{Logger: log})
	root := os.Geteuid() == 0
	mo := fuse.MountOptions{
		FsName:      "leasefs",
		Name:        "leasefs",
		Options:     []string{"default_permissions"},
		AllowOther:  opts.AllowOther,
		DirectMount: root,
		MaxWrite:    maxWrite,
		EnableLocks: true,
		Debug:       opts.Debug,
	}
	server, err := fuse.NewServer(lfs.RawFileSystem(), mp, &mo)
	if err != nil {
		return fmt.Errorf("mount: %s: %w", mp, err)
	}
	served := make(chan struct{})
	go func() {
		server.Serve()
		close(served)
	}()
	if err := server.WaitMount(); err != nil {
		_ = server.Unmount()
		return fmt.Errorf("mount: %s: %w", mp, err)
	}
	log.Info("mounted", "mountpoint", mp, "state", state, "pid", os.Getpid(),
		"lease_duration", store.LeaseDuration().String(), "allow_other", opts.AllowOther)

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	reaped := make(chan struct{})
	go func() {
		lfs.Run(runCtx)
		close(reaped)
	}()

	select {
	case <-ctx.Done():
		log.Info("unmounting", "mountpoint", mp, "reason", context.Cause(ctx))
		unmount(server, mp, root, log)
	case <-served:
		log.Info("unmounted from outside", "mountpoint", mp)
	}
	stop()
	<-reaped
	select {
	case <-served:
	case <-time.After(unmountWait):
		log.Warn("open files still reference the detached mount; exiting anyway", "mountpoint", mp)
	}
	log.Info("stopped", "mountpoint", mp)
	return nil
}

// unmount unmounts mp, detaching it lazily when it is busy; the server keeps
// serving open files of a detached mount until their release.
func unmount(server *fuse.Server, mp string, root bool, log *slog.Logger) {
	err := server.Unmount()
	if err == nil {
		return
	}
	log.Warn("mount busy; detaching lazily", "mountpoint", mp, "err", err)
	if err := detach(mp, root); err != nil {
		log.Error("lazy unmount failed", "mountpoint", mp, "err", err)
	}
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
// with ENOTCONN ("transport endpoint is not connected", SPEC §2). The caller
// holds the state directory's daemon lock, so the dead daemon was ours or
// served another state directory and is gone either way.
func cleanStale(mp string, log *slog.Logger) error {
	_, err := os.Stat(mp)
	if !errors.Is(err, unix.ENOTCONN) {
		return nil
	}
	log.Warn("detaching stale mount left by a dead daemon", "mountpoint", mp)
	return detach(mp, os.Geteuid() == 0)
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
