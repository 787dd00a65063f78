// Package mount runs the lifecycle of one leasefs mount (docs/PROTOCOL.md
// §2): the single-daemon lock on the state directory, stale-mount cleanup,
// the FUSE server (direct mount as root, fusermount3 otherwise), the store
// opened through [Options.OpenStore], the kernel-view follower [fusefs.FS.Run],
// and a clean unmount when the context ends.
package mount

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/fusefs"
	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/leasecore"
)

// DaemonLockName is the file in the state directory on which the serving
// daemon holds an exclusive flock(2) (docs/PROTOCOL.md §2).
const DaemonLockName = "leasefs.lock"

// maxWrite is the largest FUSE write request: above [fusefs.MaxPayload], so
// that an oversized payload arrives whole and is refused with EFBIG.
const maxWrite = 128 << 10

// unmountWait bounds how long shutdown waits for the server to see an
// unmount that succeeded. After a lazy one it does not wait: the open files
// of the detached mount keep their leases, and the next daemon serves them
// (docs/PROTOCOL.md §2).
const unmountWait = 5 * time.Second

// Options configure [Run]. Mountpoint is required; every other zero field
// takes its default.
type Options struct {
	// Mountpoint is the directory to mount on; it must exist.
	Mountpoint string
	// StateDir holds the daemon lock ([DaemonLockName]) and, unless
	// OpenStore says otherwise, the lease store; default [DefaultStateDir].
	StateDir string
	// LeaseDuration is the heartbeat TTL of token leases, given to the
	// embedded file store and reported in the "mounted" log line; default
	// [leasecore.DefaultLeaseDuration].
	LeaseDuration time.Duration
	// HistoryKeep and MaxLeasesPerUID: see [leasecore.Options].
	HistoryKeep     int
	MaxLeasesPerUID int
	// OpenStore opens the lease store that the mount serves. Run calls it
	// once, with its context, its logger and the hooks the store must
	// install (see [StoreHooks]), after it has taken the daemon lock of
	// StateDir and checked the mountpoint, and before it mounts; an error
	// makes Run return it, wrapped, without mounting. Run closes the store
	// before it releases the daemon lock, whether it mounted or not. When
	// nil, Run opens the embedded file store in StateDir (docs/PROTOCOL.md
	// §4.3, §8a) with LeaseDuration, HistoryKeep and MaxLeasesPerUID.
	OpenStore func(ctx context.Context, log *slog.Logger, hooks StoreHooks) (leasecore.Store, error)
	// StoreName names the store OpenStore opens (e.g. "etcd://HOST:PORT/PREFIX",
	// without credentials); it is recorded with the daemon lock for
	// "leasefs status". Empty: the file store of StateDir.
	StoreName string
	// AllowOther lets other users use the mount (docs/PROTOCOL.md §7).
	AllowOther bool
	// Logger receives the daemon's log; default slog.Default().
	Logger *slog.Logger
	// Debug logs every FUSE request (very verbose).
	Debug bool
	// Takeover asks a daemon already serving the state directory to hand
	// it over (drain, unmount, exit) instead of failing at once.
	Takeover bool
	// TakeoverTimeout bounds the wait for the running daemon to let go;
	// default [DefaultTakeoverTimeout].
	TakeoverTimeout time.Duration
	// OnReady, when set, is called once the mount answers requests, right
	// after the "mounted" log line; "leasefs mount" sends systemd READY=1
	// from it (docs/PROTOCOL.md §8b). OnReady and OnStopping run on Run's
	// goroutine and should return quickly; like all of the daemon, they
	// must not touch the mount.
	OnReady func()
	// OnStopping, when set, is called once when shutdown begins (the
	// context ended, another daemon asked to take over, or the mount was
	// unmounted from outside), before Run unmounts; "leasefs mount" sends
	// systemd STOPPING=1 from it.
	OnStopping func()
	// MetricsAddr, when set, is the HOST:PORT on which Run serves
	// Prometheus metrics at [MetricsPath] while mounted (docs/PROTOCOL.md
	// §8b); port 0 picks a free port, logged in a "serving metrics" line.
	// The store commit latency is reported by the embedded file store
	// only, not by a store from OpenStore.
	MetricsAddr string
	// Pprof, with MetricsAddr, also serves the Go runtime's profiles
	// (net/http/pprof: CPU, heap, goroutine, block, mutex) at [PprofPath]
	// on the same address, and turns on the block and mutex profiles
	// (docs/PROTOCOL.md §8b). Ignored without MetricsAddr.
	Pprof bool
}

// dyingWait bounds the wait for a killed daemon to exit once its FUSE
// connection has been aborted.
const dyingWait = 5 * time.Second

// DefaultTakeoverTimeout is how long "mount --takeover" waits for the
// running daemon to release the state directory.
const DefaultTakeoverTimeout = 10 * time.Second

// takeoverPoll is how often a daemon checks for a takeover request, and a
// taking-over daemon retries the lock: well within the one second in which
// a handover must start.
const takeoverPoll = 100 * time.Millisecond

// StoreHooks are what [Options.OpenStore] passes on to the store's options
// (leasecore.Options and the etcd store's embedded copy of them).
type StoreHooks struct {
	// OnCommit is leasecore.Options.OnCommit: called with the time each
	// committed change took to become durable; nil without
	// --metrics-addr.
	OnCommit func(time.Duration)
	// HandleHolders is leasecore.Options.HandleHolders: the processes that
	// still hold the open file of a previous daemon's handle lease
	// (docs/PROTOCOL.md §2, "Handle leases across restarts").
	HandleHolders func(leasecore.Lease) []int
}

// DefaultStateDir returns the embedded default state directory
// (docs/PROTOCOL.md §2): $LEASEFS_STATE; else /var/lib/leasefs for root;
// else $XDG_STATE_HOME/leasefs; else ~/.local/state/leasefs.
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
// directory are nested, or the state directory lies in a leasefs mount: the
// daemon would serve its own store through itself and deadlock.
var ErrInsideState = errors.New("mount: mountpoint and state directory must not be inside each other")

// ErrMounted is returned by [Run] when the mountpoint already carries a
// live leasefs mount: mounting on top would hide it.
var ErrMounted = errors.New("mount: mountpoint already has a leasefs mount")

// ErrTakeoverTimeout is returned by [Run], wrapped together with the
// *[daemonlock.HeldError] naming the holder, when a daemon asked to hand over
// (Options.Takeover) has not let go within Options.TakeoverTimeout.
var ErrTakeoverTimeout = errors.New("mount: takeover timed out")

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
	if m, ok := mountedAt(Mounts(), mp); ok && strings.HasPrefix(m.FSType, "fuse") {
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
	if m, ok := ContainingMount(Mounts(), state); ok && m.FSType == fsType {
		return "", "", fmt.Errorf("%w: %s is inside the leasefs mount %s", ErrInsideState, state, m.Point)
	}
	if err := checkMountpoint(mp); err != nil {
		return "", "", err
	}
	return mp, state, nil
}

// Run mounts leasefs on opts.Mountpoint and serves it until ctx is done or
// the filesystem is unmounted from outside, then unmounts (lazily if busy)
// and returns. Errors: a *[MountpointError] when the mountpoint is missing
// or not a directory (checked before anything is created); a
// *[daemonlock.HeldError] when another daemon serves the state directory
// (naming it), with [ErrTakeoverTimeout] when it did not hand over;
// [ErrInsideState]; [ErrMounted]; a *[FusermountError] when an unprivileged
// mount fails; the error of [Options.OpenStore], wrapped; the listen error
// of [Options.MetricsAddr], wrapped, before anything is mounted. Run logs
// "mounted" and calls [Options.OnReady] once the mount is serving, and calls
// [Options.OnStopping] when shutdown begins.
func Run(ctx context.Context, opts Options) error {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if opts.StateDir == "" {
		opts.StateDir = DefaultStateDir()
	}
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = leasecore.DefaultLeaseDuration
	}
	mp, state, err := checkPaths(opts.Mountpoint, opts.StateDir)
	if err != nil {
		return err
	}
	// A live leasefs mount on mp is refused before anything is created when
	// the state directory does not exist yet: it cannot be this one's.
	if _, err := os.Stat(state); errors.Is(err, fs.ErrNotExist) {
		if err := refuseLiveMount(mp); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		return fmt.Errorf("mount: cannot create the state directory: %w", err)
	}

	lockPath := filepath.Join(state, DaemonLockName)
	me := daemonlock.CurrentHolder("leasefs mount " + mp)
	me.Mountpoint = mp
	if opts.OpenStore != nil {
		me.Store = opts.StoreName
	}
	lock, err := acquireDaemonLock(ctx, lockPath, mp, me, opts, log)
	if err != nil {
		return err
	}
	defer lock.Release()
	// A request addressed to an earlier holder is void now.
	_ = daemonlock.ClearTakeoverRequest(lockPath)

	if err := cleanStale(mp, log); err != nil {
		return err
	}
	if err := refuseLiveMount(mp); err != nil {
		return err
	}
	if err := checkMountpoint(mp); err != nil {
		return err
	}
	// Resolve symlinks only now that a stale mount cannot block the walk.
	if real, err := filepath.EvalSymlinks(mp); err == nil {
		mp = real
	}
	if real, err := filepath.EvalSymlinks(state); err == nil && nested(real, mp) {
		return fmt.Errorf("%w: %s and %s", ErrInsideState, mp, real)
	}

	var mtr *metricsServer // nil without MetricsAddr
	if opts.MetricsAddr != "" {
		if mtr, err = listenMetrics(opts.MetricsAddr, opts.Pprof, log); err != nil {
			return err
		}
		defer mtr.shutdown()
	}
	openStore, where := opts.OpenStore, ""
	if openStore == nil {
		openStore, where = fileStoreOpener(state, opts), " in "+state
	}
	// Before the store opens: which handle leases of previous daemons
	// still have their open file (docs/PROTOCOL.md §2).
	survivors := scanSurvivors(state, opts.AllowOther, log, 0)
	store, err := openStore(ctx, log, StoreHooks{OnCommit: mtr.onCommit(), HandleHolders: survivors.holders})
	if err != nil {
		return fmt.Errorf("mount: cannot open the lease store%s: %w", where, err)
	}
	if store == nil {
		return errors.New("mount: cannot open the lease store: the opener returned none")
	}
	closeStore := sync.OnceFunc(func() {
		if err := store.Close(); err != nil {
			log.Warn("closing the lease store", "err", err)
		}
	})
	defer closeStore()

	fsOpts := fusefs.Options{Logger: log}
	mtr.instrument(store, &fsOpts)
	lfs := fusefs.New(store, fsOpts)
	root := os.Geteuid() == 0
	mo := fuse.MountOptions{
		// The source is the state directory: findmnt names the store
		// served, and mount -a sees an fstab line of it as mounted.
		FsName:      state,
		Name:        "leasefs",
		Options:     []string{"default_permissions"},
		AllowOther:  opts.AllowOther,
		DirectMount: root,
		MaxWrite:    maxWrite,
		EnableLocks: true,
		// READDIRPLUS would make go-fuse look up every listed name and
		// build an inode for it, and with zero entry and attribute
		// timeouts the kernel cannot reuse any of it: a stat after the
		// listing asks again. Plain READDIR lists 100,000 names in a
		// fraction of the time (docs/ARCHITECTURE.md, "How loading scales").
		DisableReadDirPlus: true,
		// Every read is answered from memory (a token, a status
		// document). With splicing on, go-fuse first writes the reply's
		// header into a pipe, finds no file to splice from, and drains
		// the pipe again: three wasted system calls per READ.
		DisableSplice: true,
		Debug:         opts.Debug,
	}
	server, err := fuse.NewServer(lfs.RawFileSystem(), mp, &mo)
	if err != nil {
		if !root {
			return newFusermountError(mp, opts.AllowOther, err, systemFuse)
		}
		return fmt.Errorf("mount: cannot mount on %s: %w", mp, err)
	}
	served := make(chan struct{})
	go func() {
		server.Serve()
		close(served)
	}()
	if err := server.WaitMount(); err != nil {
		_ = server.Unmount()
		return fmt.Errorf("mount: cannot mount on %s: %w", mp, err)
	}
	// Record the mount for the next daemon, before any handle lease is
	// granted through it, if the kernel shows it: fdinfo of the open files
	// of this mount names it after this daemon is gone.
	if m, ok := mountedAt(Mounts(), mp); ok && m.FSType == fsType && m.ID > 0 {
		if err := survivors.record(state, m.ID); err != nil {
			log.Warn("cannot record the mount id: handle leases held through this mount will end when the next daemon starts",
				"path", filepath.Join(state, MountsRecordName), "err", err)
		}
	}
	lfs.Adopt(survivors.kept)
	if err := lfs.StartSelfUnlink(mp); err != nil {
		log.Warn("directory watches will not see the daemon's own ends", "mountpoint", mp, "err", err)
	}
	log.Info("mounted", "mountpoint", mp, "state", state, "pid", os.Getpid(),
		"lease_duration", opts.LeaseDuration.String(), "allow_other", opts.AllowOther)
	mtr.serve()
	if opts.OnReady != nil {
		opts.OnReady()
	}
	stopping := func() {
		if opts.OnStopping != nil {
			opts.OnStopping()
		}
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	reaped := make(chan struct{})
	go func() {
		lfs.Run(runCtx)
		close(reaped)
	}()

	takeover := watchTakeover(runCtx, lockPath)
	detached := false // lazily, with open files left
	select {
	case <-ctx.Done():
		log.Info("unmounting", "mountpoint", mp, "reason", context.Cause(ctx))
		stopping()
		warnHandleLeases(store, log)
		lfs.StopSelfUnlink()
		detached = unmount(server, mp, root, log)
	case req := <-takeover:
		log.Info("handing over to another daemon", "mountpoint", mp, "requester", req.Requester.String())
		stopping()
		lfs.Drain(runCtx)
		lfs.StopSelfUnlink()
		detached = unmount(server, mp, root, log)
	case <-served:
		log.Info("unmounted from outside", "mountpoint", mp)
		stopping()
		lfs.StopSelfUnlink()
	}
	stop()
	<-reaped
	mtr.shutdown()
	// Open files of a lazily detached mount may still reach this daemon:
	// close the store first so that nothing is written after the lock
	// passes to another daemon.
	closeStore()
	if err := lock.Release(); err != nil {
		log.Warn("releasing the daemon lock", "err", err)
	}
	if !detached {
		select {
		case <-served:
		case <-time.After(unmountWait):
			log.Warn("the mount did not go away; exiting anyway", "mountpoint", mp)
		}
	}
	log.Info("stopped", "mountpoint", mp)
	return nil
}

// warnHandleLeases logs every handle lease held through this daemon: each
// outlives it while its open file lives, and the next daemon of this state
// directory keeps it (docs/PROTOCOL.md §2, §8b).
func warnHandleLeases(store leasecore.Store, log *slog.Logger) {
	leases, err := store.List(context.Background())
	if err != nil {
		log.Warn("listing handle leases before stopping", "err", err)
		return
	}
	for _, l := range leases {
		// Not those held through other daemons sharing the store (etcd).
		if leasecore.OwnsHandle(store, l) {
			log.Info("handle lease outlives this daemon while its open file lives", "resource", l.Resource, "lease", l.ID,
				"holder_pid", l.HolderPID, "holder_uid", l.HolderUID)
		}
	}
}

// fileStoreOpener is the default [Options.OpenStore]: the embedded file
// store in the state directory state, with hooks installed.
func fileStoreOpener(state string, opts Options) func(context.Context, *slog.Logger, StoreHooks) (leasecore.Store, error) {
	return func(_ context.Context, log *slog.Logger, hooks StoreHooks) (leasecore.Store, error) {
		s, err := leasecore.OpenFileStore(state, leasecore.Options{
			LeaseDuration:   opts.LeaseDuration,
			HistoryKeep:     opts.HistoryKeep,
			MaxLeasesPerUID: opts.MaxLeasesPerUID,
			Logger:          log,
			OnCommit:        hooks.OnCommit,
			HandleHolders:   hooks.HandleHolders,
		})
		if err != nil {
			return nil, err // a nil Store, not a Store holding a nil *FileStore
		}
		return s, nil
	}
}

// acquireDaemonLock takes the state directory's daemon lock. A holder that
// was killed but is stuck in the kernel on its own mount has its connection
// aborted and is waited for. When another daemon holds it and opts.Takeover
// is set, it writes a takeover request and
// retries until the holder lets go or opts.TakeoverTimeout passes.
// Errors: *daemonlock.HeldError naming the holder.
func acquireDaemonLock(ctx context.Context, path, mp string, me daemonlock.Holder, opts Options, log *slog.Logger) (*daemonlock.Lock, error) {
	lock, err := daemonlock.Acquire(path, me)
	var held *daemonlock.HeldError
	if err == nil || !errors.As(err, &held) {
		return lock, err
	}
	if abortDyingHolder(held, mp, log) {
		// The killed holder exits, and its lock goes, once its blocked
		// thread is freed.
		for end := time.Now().Add(dyingWait); time.Now().Before(end); {
			time.Sleep(takeoverPoll)
			if lock, err = daemonlock.Acquire(path, me); err == nil || !errors.Is(err, daemonlock.ErrHeld) {
				return lock, err
			}
		}
	}
	if !opts.Takeover {
		return nil, err
	}
	timeout := opts.TakeoverTimeout
	if timeout <= 0 {
		timeout = DefaultTakeoverTimeout
	}
	log.Info("asking the running daemon to hand over", "holder", held.Holder.String(), "timeout", timeout.String())
	if werr := daemonlock.WriteTakeoverRequest(path, daemonlock.TakeoverRequest{Requester: me}); werr != nil {
		return nil, werr
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(takeoverPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = daemonlock.ClearTakeoverRequest(path)
			return nil, ctx.Err()
		case <-deadline.C:
			_ = daemonlock.ClearTakeoverRequest(path)
			return nil, fmt.Errorf("%w after %s: %w", ErrTakeoverTimeout, timeout, err)
		case <-tick.C:
		}
		if lock, err = daemonlock.Acquire(path, me); err == nil || !errors.Is(err, daemonlock.ErrHeld) {
			return lock, err
		}
	}
}

// watchTakeover polls for a takeover request on the daemon lock at path and
// delivers the first one.
func watchTakeover(ctx context.Context, path string) <-chan daemonlock.TakeoverRequest {
	ch := make(chan daemonlock.TakeoverRequest, 1)
	go func() {
		tick := time.NewTicker(takeoverPoll)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if req, ok := daemonlock.ReadTakeoverRequest(path); ok {
				ch <- req
				return
			}
		}
	}()
	return ch
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
	m, ok := mountedAt(Mounts(), mp)
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
