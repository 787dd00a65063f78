// Package mount runs the lifecycle of one leasefs mount (docs/PROTOCOL.md
// §2): the single-daemon lock on the state directory, stale-mount cleanup,
// the FUSE server (direct mount as root, fusermount3 otherwise), the store
// opened through [Options.OpenStore], the kernel-view follower [fusefs.FS.Run],
// and a clean unmount when the context ends.
package mount

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/filestore"
	"github.com/leasefs/leasefs/fusefs"
	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/leasecore"
)

// DaemonLockName is the file in the state directory on which the serving
// daemon holds an exclusive flock(2) (docs/PROTOCOL.md §2).
const DaemonLockName = "leasefs.lock"

// fsType is the filesystem type leasefs mounts show in /proc/self/mountinfo.
const fsType = "fuse.leasefs"

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
	// before it releases the daemon lock, whether it mounted or not.
	// Required: [FileStoreOpener] opens the embedded file store; the
	// command picks the store in one place (internal/cli/storeflag.go).
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
	// KernelKnows reports whether the kernel of this mount knows resource
	// (an inode of it is in the mount's tree); false until the mount
	// serves. The etcd store follows such names (etcdstore.Options).
	// Safe for concurrent use; it takes no lock of the store.
	KernelKnows func(resource string) bool
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

// ErrNoStore is returned by [Run] when Options.OpenStore is nil: the
// caller picks the store ([FileStoreOpener] for the file store).
var ErrNoStore = errors.New("mount: no store to serve: Options.OpenStore is nil")

// ErrInsideMount is returned by [Run] when the mountpoint lies inside
// another leasefs mount (a namespace of it): the new mount would stack on
// the other's directory, which could then be neither removed nor served
// (docs/PROTOCOL.md §2, "Refused set-ups").
var ErrInsideMount = errors.New("mount: the mountpoint must not be inside a leasefs mount")

// ErrMounted is returned by [Run] when the mountpoint already carries a
// live leasefs mount: mounting on top would hide it.
var ErrMounted = errors.New("mount: mountpoint already has a leasefs mount")

// ErrTakeoverTimeout is returned by [Run], wrapped together with the
// *[daemonlock.HeldError] naming the holder, when a daemon asked to hand over
// (Options.Takeover) has not let go within Options.TakeoverTimeout.
var ErrTakeoverTimeout = errors.New("mount: takeover timed out")

// Run mounts leasefs on opts.Mountpoint and serves it until ctx is done or
// the filesystem is unmounted from outside, then unmounts (lazily if busy)
// and returns. Errors: a *[MountpointError] when the mountpoint is missing
// or not a directory (checked before anything is created); a
// *[daemonlock.HeldError] when another daemon serves the state directory
// (naming it), with [ErrTakeoverTimeout] when it did not hand over;
// [ErrNoStore]; [ErrInsideState]; [ErrInsideMount]; [ErrMounted]; a *[FusermountError] when an unprivileged
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
	if opts.OpenStore == nil {
		return ErrNoStore
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
	me.Store = opts.StoreName
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
	if opts.StoreName == "" {
		where = " in " + state
	}
	// Before the store opens: which handle leases of previous daemons
	// still have their open file (docs/PROTOCOL.md §2).
	survivors := scanSurvivors(state, opts.AllowOther, log, 0)
	var tree atomic.Pointer[fusefs.FS] // the tree KernelKnows asks, once it exists
	kernelKnows := func(resource string) bool {
		f := tree.Load()
		return f != nil && f.KernelKnows(resource)
	}
	store, err := openStore(ctx, log, StoreHooks{OnCommit: mtr.onCommit(), HandleHolders: survivors.holders, KernelKnows: kernelKnows})
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
	tree.Store(lfs)
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
		// Atomic O_TRUNC: the kernel passes O_TRUNC in the OPEN (or
		// CREATE) and sends no SETATTR after it. Without it the truncate
		// of an O_TRUNC open is a SETATTR without a file handle that
		// reaches the inode the kernel looked up, after the open may have
		// bound another lease of the name (docs/PROTOCOL.md §3, "Opening
		// a path").
		ExtraCapabilities: fuse.CAP_ATOMIC_O_TRUNC,
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
	if m, ok := procfs.MountedAt(procfs.Mounts(), mp); ok && m.FSType == fsType && m.ID > 0 {
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

// FileStoreOpener returns the [Options.OpenStore] of the embedded file
// store (package filestore, docs/PROTOCOL.md §4.3) in opts.StateDir, with
// opts' LeaseDuration, HistoryKeep and MaxLeasesPerUID and the hooks Run
// passes. Errors of the opener: [filestore.Open]'s.
func FileStoreOpener(opts Options) func(context.Context, *slog.Logger, StoreHooks) (leasecore.Store, error) {
	return func(_ context.Context, log *slog.Logger, hooks StoreHooks) (leasecore.Store, error) {
		state, err := filepath.Abs(cmp.Or(opts.StateDir, DefaultStateDir()))
		if err != nil {
			return nil, err
		}
		s, err := filestore.Open(state, filestore.Options{Options: leasecore.Options{
			LeaseDuration:   opts.LeaseDuration,
			HistoryKeep:     opts.HistoryKeep,
			MaxLeasesPerUID: opts.MaxLeasesPerUID,
			Logger:          log,
			OnCommit:        hooks.OnCommit,
			HandleHolders:   hooks.HandleHolders,
		}})
		if err != nil {
			return nil, err // a nil Store, not a Store holding a nil *filestore.Store
		}
		return s, nil
	}
}
