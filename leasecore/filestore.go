package leasecore

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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

// FileStore is the embedded [Store]: TOML records in a state directory
// (docs/PROTOCOL.md §4.3), serialised by flock(2) across processes and by
// the mutex of the lease engine within one. All methods are safe for
// concurrent use. A state directory must be written by one FileStore at a
// time (the daemon lock ensures it); read-only stores may coexist with it.
type FileStore struct {
	*store
	state    string // the state directory
	dir      string // state/writer-leases
	lockFile *os.File
	dirFile  *os.File // dir, opened for fsync
	stFile   *os.File // state, opened for fsync
	hwSaved  uint64   // value in the generation file
}

var (
	_ Store     = (*FileStore)(nil)
	_ persister = (*FileStore)(nil)
)

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
	opts = opts.withDefaults()
	s := &FileStore{state: state, dir: filepath.Join(state, LeasesDir)}
	s.store = newStore(opts, s)
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
	if !opts.ReadOnly {
		s.startReaper()
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

// close releases the store's files (persister).
func (s *FileStore) close() { s.closeFiles() }

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

// readLockWait bounds how long a read-only store waits for the shared
// store lock. A writer holds it only for one record write; a longer hold
// means a writer that cannot let go — a killed daemon stuck in the kernel
// on its own mount, which keeps its descriptors (and locks) until its FUSE
// connection is aborted — and "leasefs ls" must not hang behind it.
const readLockWait = 2 * time.Second

// readLock takes the shared store lock for a read-only load, waiting at
// most readLockWait; after that it reads without the lock (every record is
// replaced by an atomic rename, so each one read is whole) and logs why.
func (s *FileStore) readLock() func() {
	if s.lockFile == nil {
		return func() {}
	}
	fd := int(s.lockFile.Fd())
	deadline := time.Now().Add(readLockWait)
	for {
		err := unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB)
		if err == nil {
			return func() { _ = unix.Flock(fd, unix.LOCK_UN) }
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) || time.Now().After(deadline) {
			s.opts.Logger.Warn("reading the store without its lock: a writer holds it and does not let go (a daemon stuck in the kernel?)",
				"path", s.lockFile.Name(), "err", err)
			return func() {}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// load reads every record, the namespaces and the generation mark.
func (s *FileStore) load() error {
	var unlock func()
	if s.opts.ReadOnly {
		unlock = s.readLock()
	} else {
		var err error
		if unlock, err = s.flock(unix.LOCK_EX); err != nil {
			return err
		}
	}
	defer unlock()

	names, err := s.dirFile.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("leasecore: list records: %w", err)
	}
	if _, err := s.dirFile.Seek(0, 0); err != nil {
		return fmt.Errorf("leasecore: list records: %w", err)
	}
	if err := s.loadRecords(names); err != nil {
		return err
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
		s.served = s.loadWaiters()
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
			if err := s.endLocked(e, e.lease, StatusAbandoned, ChangeExpired, "superseded by a newer active record", true); err != nil {
				return err
			}
		case e.lease.Mode == ModeHandle && e.lease.Host == s.opts.Host:
			// A daemon ends only its own previous handle leases.
			if err := s.endLocked(e, e.lease, StatusAbandoned, ChangeExpired, "handle lease of a previous daemon", true); err != nil {
				return err
			}
		case e.lease.Generation == 0:
			// A record of the reference store: give it a generation so it
			// has a fencing number and an inode of its own.
			l := e.lease
			l.Generation = s.hw + 1
			if err := s.disk.writeRecord(&l, e.hash); err != nil {
				return err
			}
			s.hw = l.Generation
			e.lease = l
		}
	}
	return nil
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

// Dir returns the state directory. Safe for concurrent use.
func (s *FileStore) Dir() string { return s.state }

// removeRecords deletes the records of pruned leases and fsyncs the
// directory (persister).
func (s *FileStore) removeRecords(ids []string) error {
	unlock, err := s.flock(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	for _, id := range ids {
		if err := removeFile(filepath.Join(s.dir, id+".toml")); err != nil {
			return err
		}
	}
	if err := s.dirFile.Sync(); err != nil {
		return &PersistError{Op: "sync", Path: s.dir, Err: err}
	}
	return nil
}

// saveGeneration persists the generation high-water mark hw (persister).
func (s *FileStore) saveGeneration(hw uint64) error {
	if s.hwSaved >= hw {
		return nil
	}
	data := []byte(strconv.FormatUint(hw, 10) + "\n")
	if err := writeFile(s.stFile, filepath.Join(s.state, generationName), data); err != nil {
		return err
	}
	s.hwSaved = hw
	return nil
}
