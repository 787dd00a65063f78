package leasecore

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/renameio/v2"
	"golang.org/x/sys/unix"
)

// Layout of a state directory (docs/PROTOCOL.md §2, §4.3).
const (
	// LeasesDir holds one <lease-id>.toml record per lease.
	LeasesDir = "writer-leases"
	// storeLockName is the flock(2) that serialises mutations across
	// processes, inside LeasesDir. It is never removed.
	storeLockName = ".lock"
	// generationName persists the generation high-water mark, so pruning
	// history never lets a generation be granted twice.
	generationName = "generation"
	// namespacesName persists the namespaces (directories) of the mount.
	namespacesName = "namespaces.toml"
	// durationName records the lease duration the store was last served
	// with, so that "leasefs ls" judges expiry as the daemon does.
	durationName = "lease-duration"
)

// Options configure [OpenFileStore]. The zero value works: every zero field
// takes its documented default.
type Options struct {
	// LeaseDuration is the heartbeat TTL of token leases; default
	// [DefaultLeaseDuration], or for a ReadOnly store the duration the
	// directory was last served with.
	LeaseDuration time.Duration
	// HistoryKeep is how many ended records are kept; default
	// [DefaultHistoryKeep]. Older ones are pruned by [FileStore.Reap].
	HistoryKeep int
	// MaxLeasesPerUID bounds live leases per holder uid; default
	// [DefaultMaxLeasesPerUID].
	MaxLeasesPerUID int
	// Clock is the time source; default [NewSystemClock].
	Clock Clock
	// Host is recorded as the lease host; default [Hostname].
	Host string
	// ReadOnly opens the store for reading under a shared lock: nothing is
	// written, dead leases are filtered out instead of ended, and mutating
	// methods return ErrReadOnly. Used by "leasefs ls" and "history".
	ReadOnly bool
	// NoDaemon, with ReadOnly, says that no daemon serves the directory:
	// handle leases, which live only as long as a daemon's open files, are
	// then reported dead (docs/PROTOCOL.md §2).
	NoDaemon bool
	// Logger receives one line per record that could not be loaded and per
	// lease ended at open; default slog.Default().
	Logger *slog.Logger
}

// entry is the in-memory state of one record.
type entry struct {
	lease Lease
	hash  string
	// hbMono is the heartbeat on the store's monotonic clock.
	hbMono time.Duration
}

// FileStore is the embedded [Store]: TOML records in a state directory,
// serialised by flock(2) across processes and by a mutex within one. All
// methods are safe for concurrent use. A state directory must be written by
// one FileStore at a time (the daemon lock of [AcquireFileLock] ensures it);
// read-only stores may coexist with it.
type FileStore struct {
	mu       sync.Mutex
	opts     Options
	state    string // the state directory
	dir      string // state/writer-leases
	lockFile *os.File
	dirFile  *os.File // dir, opened for fsync
	stFile   *os.File // state, opened for fsync
	bootID   string
	closed   bool

	leases     map[string]*entry // by lease id, every loaded record
	live       map[string]*entry // by resource, active leases only
	perUID     map[uint32]int    // live leases per holder uid
	namespaces map[string]Namespace
	// waiters counts blocked flock waiters per resource (AddWaiters).
	waiters map[string]int
	// unsynced holds leases ended in memory whose record could not be
	// written yet (see endLocked).
	unsynced map[string]*entry
	hw       uint64 // highest generation granted
	hwSaved  uint64 // value in the generation file
}

var _ Store = (*FileStore)(nil)

// OpenFileStore opens (creating if needed, mode 0700) the state directory and
// loads its records. Unless opts.ReadOnly, it ends recorded handle leases as
// abandoned (their open files died with the previous daemon, docs/PROTOCOL.md
// §2) and assigns generations to active records written by the reference
// store. With opts.ReadOnly, a state directory that was never served (it
// does not exist, or has no writer-leases directory) is an empty store, and
// nothing is created (docs/PROTOCOL.md §8).
// Unreadable or corrupt records are logged and skipped, never fatal.
// Errors: filesystem errors creating, locking or listing the directory.
func OpenFileStore(state string, opts Options) (*FileStore, error) {
	recorded := opts.ReadOnly && opts.LeaseDuration <= 0
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = DefaultLeaseDuration
	}
	if opts.HistoryKeep <= 0 {
		opts.HistoryKeep = DefaultHistoryKeep
	}
	if opts.MaxLeasesPerUID <= 0 {
		opts.MaxLeasesPerUID = DefaultMaxLeasesPerUID
	}
	if opts.Clock == nil {
		opts.Clock = NewSystemClock()
	}
	if opts.Host == "" {
		opts.Host = Hostname()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &FileStore{
		opts:       opts,
		state:      state,
		dir:        filepath.Join(state, LeasesDir),
		bootID:     BootID(),
		leases:     make(map[string]*entry),
		live:       make(map[string]*entry),
		perUID:     make(map[uint32]int),
		namespaces: make(map[string]Namespace),
		waiters:    make(map[string]int),
		unsynced:   make(map[string]*entry),
	}
	if opts.ReadOnly {
		// Without writer-leases (or without the state directory itself) no
		// daemon ever wrote here: the store is empty and stays untouched.
		// Any other failure, such as ENOTDIR or EACCES, is reported by
		// openFiles.
		if _, err := os.Stat(s.dir); errors.Is(err, fs.ErrNotExist) {
			return s, nil
		}
	}
	if err := s.openFiles(); err != nil {
		s.closeFiles()
		return nil, err
	}
	if err := s.settleDuration(recorded); err != nil {
		s.closeFiles()
		return nil, err
	}
	if err := s.load(); err != nil {
		s.closeFiles()
		return nil, err
	}
	return s, nil
}

func (s *FileStore) openFiles() error {
	if s.opts.ReadOnly {
		if _, err := os.Stat(s.dir); err != nil {
			return fmt.Errorf("leasecore: open store: %w", err)
		}
	} else {
		for _, d := range []string{s.state, s.dir} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				return fmt.Errorf("leasecore: create state directory: %w", err)
			}
		}
	}
	// flock(2) needs no write access: a read-only descriptor lets an
	// administrator remount the state filesystem read-only.
	flags := os.O_RDONLY | os.O_CREATE
	if s.opts.ReadOnly {
		flags = os.O_RDONLY
	}
	var err error
	s.lockFile, err = os.OpenFile(filepath.Join(s.dir, storeLockName), flags|unix.O_CLOEXEC, 0o600)
	if err != nil && !(s.opts.ReadOnly && errors.Is(err, fs.ErrNotExist)) {
		return fmt.Errorf("leasecore: open store lock: %w", err)
	}
	// A read-only store without a lock file reads a directory that no
	// writer has used: there is nothing to serialise against.
	if s.dirFile, err = os.Open(s.dir); err != nil {
		return fmt.Errorf("leasecore: open store: %w", err)
	}
	if s.stFile, err = os.Open(s.state); err != nil {
		return fmt.Errorf("leasecore: open store: %w", err)
	}
	return nil
}

// settleDuration records the lease duration of a writable store in the
// state directory, or, when adopt, takes the recorded one for a read-only
// store.
func (s *FileStore) settleDuration(adopt bool) error {
	path := filepath.Join(s.state, durationName)
	data, err := os.ReadFile(path)
	recorded, perr := time.ParseDuration(strings.TrimSpace(string(data)))
	switch {
	case adopt:
		if err == nil && perr == nil && recorded > 0 {
			s.opts.LeaseDuration = recorded
		}
		return nil
	case s.opts.ReadOnly || err == nil && perr == nil && recorded == s.opts.LeaseDuration:
		return nil
	}
	return writeFile(s.stFile, path, []byte(s.opts.LeaseDuration.String()+"\n"))
}

func (s *FileStore) closeFiles() {
	for _, f := range []*os.File{s.lockFile, s.dirFile, s.stFile} {
		if f != nil {
			f.Close()
		}
	}
}

// flock takes the cross-process store lock, retrying on EINTR, and returns
// its release.
func (s *FileStore) flock(how int) (func(), error) {
	if s.lockFile == nil {
		return func() {}, nil
	}
	for {
		err := unix.Flock(int(s.lockFile.Fd()), how)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EINTR) {
			return nil, fmt.Errorf("leasecore: lock store: %w", err)
		}
	}
	return func() { _ = unix.Flock(int(s.lockFile.Fd()), unix.LOCK_UN) }, nil
}

// load reads every record, the namespaces and the generation mark.
func (s *FileStore) load() error {
	how := unix.LOCK_EX
	if s.opts.ReadOnly {
		how = unix.LOCK_SH
	}
	unlock, err := s.flock(how)
	if err != nil {
		return err
	}
	defer unlock()

	names, err := s.dirFile.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("leasecore: list records: %w", err)
	}
	if _, err := s.dirFile.Seek(0, 0); err != nil {
		return fmt.Errorf("leasecore: list records: %w", err)
	}
	now, mono := s.opts.Clock.Now(), s.opts.Clock.Mono()
	for _, name := range names {
		path := filepath.Join(s.dir, name)
		if strings.HasPrefix(name, ".lease-") && !strings.HasSuffix(name, ".toml") {
			// A temporary file left by a crash mid-write: the record it was
			// to replace is intact, so the leftover is garbage.
			if !s.opts.ReadOnly {
				_ = os.Remove(path)
			}
			continue
		}
		id, ok := strings.CutSuffix(name, ".toml")
		if !ok || ValidateLeaseID(id) != nil {
			continue
		}
		data, err := readRecordFile(path)
		if err != nil {
			s.opts.Logger.Warn("skipping unreadable lease record", "path", path, "err", err)
			continue
		}
		l, hash, err := decodeRecord(data)
		if err == nil && l.ID != id {
			err = fmt.Errorf("lease_id %q does not match the file name", l.ID)
		}
		if err != nil {
			s.opts.Logger.Warn("skipping corrupt lease record", "path", path, "err", err)
			continue
		}
		e := &entry{lease: l, hash: hash}
		s.fillExpiry(&e.lease)
		age := max(now.Sub(e.lease.HeartbeatAt), 0)
		e.hbMono = mono - age
		s.leases[id] = e
		s.hw = max(s.hw, e.lease.Generation)
	}
	if data, err := os.ReadFile(filepath.Join(s.state, generationName)); err == nil {
		n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
		if err != nil || n > MaxGeneration {
			s.opts.Logger.Warn("ignoring corrupt generation file", "path", filepath.Join(s.state, generationName))
		} else {
			s.hwSaved = n
			s.hw = max(s.hw, n)
		}
	}
	if !s.opts.ReadOnly {
		// Temporary files of the generation and namespaces files left by
		// a crash mid-write.
		for _, pattern := range []string{"." + generationName + "*", "." + namespacesName + "*"} {
			leftovers, _ := filepath.Glob(filepath.Join(s.state, pattern))
			for _, p := range leftovers {
				_ = os.Remove(p)
			}
		}
	}
	if err := s.loadNamespaces(); err != nil {
		return err
	}
	switch {
	case !s.opts.ReadOnly:
		s.removeWaiters()
	case !s.opts.NoDaemon:
		s.loadWaiters()
	}

	// Index active leases; settle duplicates and leftovers of a previous
	// daemon in generation order so the outcome is deterministic.
	active := make([]*entry, 0)
	for _, e := range s.leases {
		if e.lease.Status == StatusActive {
			active = append(active, e)
		}
	}
	slices.SortFunc(active, func(a, b *entry) int {
		return cmp.Or(cmp.Compare(a.lease.Generation, b.lease.Generation),
			a.lease.StartedAt.Compare(b.lease.StartedAt), strings.Compare(a.lease.ID, b.lease.ID))
	})
	for _, e := range active {
		if prev := s.live[e.lease.Resource]; prev != nil {
			// Two active records for one resource cannot both be live;
			// the newer wins.
			s.dropLive(prev)
		}
		s.addLive(e)
	}
	if s.opts.ReadOnly {
		return nil
	}
	for _, e := range active {
		switch {
		case s.live[e.lease.Resource] != e:
			if err := s.endLocked(e, e.lease, StatusAbandoned, "superseded by a newer active record", true); err != nil {
				return err
			}
		case e.lease.Mode == ModeHandle:
			if err := s.endLocked(e, e.lease, StatusAbandoned, "handle lease of a previous daemon", true); err != nil {
				return err
			}
		case e.lease.Generation == 0:
			// A record of the reference store: give it a generation so it
			// has a fencing number and an inode of its own.
			l := e.lease
			l.Generation = s.hw + 1
			if err := s.writeRecord(&l, e.hash); err != nil {
				return err
			}
			s.hw = l.Generation
			e.lease = l
		}
	}
	return nil
}

// fillExpiry sets ExpiresAt from the heartbeat and mode.
func (s *FileStore) fillExpiry(l *Lease) {
	l.ExpiresAt = time.Time{}
	if l.Mode == ModeToken && l.Status == StatusActive {
		l.ExpiresAt = l.HeartbeatAt.Add(s.opts.LeaseDuration)
	}
}

func (s *FileStore) addLive(e *entry) {
	s.live[e.lease.Resource] = e
	s.perUID[e.lease.HolderUID]++
}

func (s *FileStore) dropLive(e *entry) {
	if s.live[e.lease.Resource] == e {
		delete(s.live, e.lease.Resource)
		if s.perUID[e.lease.HolderUID]--; s.perUID[e.lease.HolderUID] <= 0 {
			delete(s.perUID, e.lease.HolderUID)
		}
	}
}

// readRecordFile reads a record without following symlinks or blocking on
// special files: only a regular file of at most maxRecordBytes is read.
func readRecordFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s)", st.Mode().Type())
	}
	if st.Size() > maxRecordBytes {
		return nil, fmt.Errorf("record of %d bytes exceeds %d", st.Size(), maxRecordBytes)
	}
	return io.ReadAll(io.LimitReader(f, maxRecordBytes+1))
}

// writeFile replaces path atomically and durably: a pending file in the same
// directory, fsync, rename, fsync of the directory (docs/PROTOCOL.md §4.3).
func writeFile(dir *os.File, path string, data []byte) error {
	pf, err := renameio.NewPendingFile(path,
		renameio.WithTempDir(filepath.Dir(path)), renameio.WithStaticPermissions(0o600))
	if err != nil {
		return &PersistError{Op: "write", Path: path, Err: err}
	}
	defer pf.Cleanup()
	if _, err := pf.Write(data); err != nil {
		return &PersistError{Op: "write", Path: path, Err: err}
	}
	if err := pf.CloseAtomicallyReplace(); err != nil {
		return &PersistError{Op: "write", Path: path, Err: err}
	}
	if err := dir.Sync(); err != nil {
		return &PersistError{Op: "sync", Path: filepath.Dir(path), Err: err}
	}
	return nil
}

// writeRecord persists l under the cross-process lock. The caller holds mu.
func (s *FileStore) writeRecord(l *Lease, hash string) error {
	data := encodeRecord(l, hash)
	unlock, err := s.flock(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	return writeFile(s.dirFile, filepath.Join(s.dir, l.ID+".toml"), data)
}

// deadReason applies docs/PROTOCOL.md §5 to an active lease and returns why it is dead,
// or "" when it is live.
func (s *FileStore) deadReason(e *entry) string {
	l := &e.lease
	if l.Status != StatusActive {
		return "ended"
	}
	if l.Mode == ModeHandle && s.opts.ReadOnly && s.opts.NoDaemon {
		return "no daemon holds its open file"
	}
	if l.Mode == ModeToken && s.opts.Clock.Mono()-e.hbMono >= s.opts.LeaseDuration {
		return "heartbeat expired"
	}
	if l.BootID != "" && s.bootID != "" && l.BootID != s.bootID {
		return "machine rebooted"
	}
	if l.PID > 0 && (l.BootID == "" || l.BootID == s.bootID) && processGone(l.PID, l.PIDStartTicks) {
		return "holder process gone"
	}
	return ""
}

// endLocked ends e with status, durably, recording it as l (e's lease,
// possibly with annotations applied). The caller holds mu.
//
// When deferrable and the record cannot be written (disk full, read-only),
// the end still takes effect in memory and the record is written later by
// [FileStore.Reap]: this is safe for leases that would be ended again after
// a restart whatever the disk says, namely those dead by the liveness rules
// of docs/PROTOCOL.md §5 and handle leases, which no daemon keeps across a restart
// (docs/PROTOCOL.md §2). A lease released by its holder is not deferrable: the release
// fails and nothing changes.
func (s *FileStore) endLocked(e *entry, l Lease, status Status, reason string, deferrable bool) error {
	l.Status = status
	l.CompletedAt = s.opts.Clock.Now().UTC()
	s.fillExpiry(&l)
	if err := s.writeRecord(&l, e.hash); err != nil {
		if !deferrable {
			return err
		}
		s.unsynced[l.ID] = e
		s.opts.Logger.Warn("lease ended in memory; its record will be written when the disk allows",
			"resource", l.Resource, "lease", l.ID, "err", err)
	}
	s.dropLive(e)
	e.lease = l
	if status == StatusAbandoned {
		s.opts.Logger.Info("lease ended", "resource", l.Resource, "lease", l.ID,
			"generation", l.Generation, "status", status, "reason", reason)
	}
	return nil
}

// syncLocked writes the records of leases ended in memory only. The caller
// holds mu.
func (s *FileStore) syncLocked() error {
	for id, e := range s.unsynced {
		if err := s.writeRecord(&e.lease, e.hash); err != nil {
			return err
		}
		delete(s.unsynced, id)
	}
	return nil
}

// checkLive ends e if it is dead. It reports whether e is live. In a
// read-only store a dead lease is only reported.
func (s *FileStore) checkLive(e *entry) (bool, error) {
	reason := s.deadReason(e)
	if reason == "" {
		return true, nil
	}
	if e.lease.Status != StatusActive || s.opts.ReadOnly {
		return false, nil
	}
	return false, s.endLocked(e, e.lease, StatusAbandoned, reason, true)
}

// LeaseDuration returns the heartbeat TTL of token leases. Safe for
// concurrent use.
func (s *FileStore) LeaseDuration() time.Duration { return s.opts.LeaseDuration }

// Dir returns the state directory. Safe for concurrent use.
func (s *FileStore) Dir() string { return s.state }

// Close closes the store's files. Further calls return ErrClosed. Safe for
// concurrent use; a second Close is a no-op.
func (s *FileStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if !s.opts.ReadOnly {
		if err := s.syncLocked(); err != nil {
			s.opts.Logger.Warn("closing with ended leases not yet written", "count", len(s.unsynced), "err", err)
		}
	}
	s.closed = true
	s.closeFiles()
	return nil
}

// begin takes mu and checks the store is open (and writable when write).
func (s *FileStore) begin(write bool) error {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return ErrClosed
	case write && s.opts.ReadOnly:
		s.mu.Unlock()
		return ErrReadOnly
	}
	return nil
}

func (s *FileStore) snapshot(e *entry) Lease {
	l := e.lease
	s.fillExpiry(&l)
	if l.Status == StatusActive {
		l.Waiters = s.waiters[l.Resource]
	}
	return l
}
