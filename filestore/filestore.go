package filestore

import (
	"github.com/leasefs/leasefs/internal/engine"
	"github.com/leasefs/leasefs/leasecore"

	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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

// Store is the embedded [leasecore.Store]: TOML records in a state directory
// (docs/PROTOCOL.md §4.3), serialised by flock(2) across processes and by
// the mutex of the lease engine within one. All methods are safe for
// concurrent use. A state directory must be written by one Store at a
// time (the daemon lock ensures it); read-only stores may coexist with it.
type Store struct {
	*engine.Engine
	// seam is the engine's lock and loading hooks (engine.Seam).
	seam            engine.Seam
	opts            Options
	state           string // the state directory
	dir             string // state/writer-leases
	lockFile        *os.File
	dirFile         *os.File // dir, opened for fsync
	stFile          *os.File // state, opened for fsync
	savedGeneration uint64   // value in the generation file
	// jr holds the active journal of a writable store (nil when
	// read-only); it is swapped under mu and read by await without it.
	jr atomic.Pointer[journal]
	// prev is the other journal file: the previous epoch's, valid until
	// ckpt is done. Guarded by mu.
	prev *journal
	// dirty holds the lease ids whose records changed in the active epoch.
	// Guarded by mu.
	dirty map[string]struct{}
	// lagging holds the records whose latest change is journaled but not
	// yet written to their files, by lease id (writebehind.go); each is
	// also in dirty. Guarded by mu.
	lagging map[string]laggingRecord
	// lagVersion numbers the changes written behind. Guarded by mu.
	lagVersion uint64
	// recMu serialises what is done to the files of writer-leases — record
	// writes, renames and removals, the pool's free list — and the holds
	// of the store lock (flock) that cover them.
	//
	// Lock order: mu, then recMu, then a journal's mu and the pool's mu.
	// The record flusher alone holds recMu without mu, while it writes a
	// batch (writebehind.go); it takes recMu before it lets mu go.
	recMu sync.Mutex
	// loading: load holds recMu and the store lock, under which the
	// records it settles are written. Set and read only by the goroutine
	// that opens the store, before the flusher starts.
	loading bool
	// flusher writes lagging records in the background.
	flusher recordFlusher
	// ckpt is the background checkpoint of prev's epoch, nil once it has
	// succeeded and been accounted. Guarded by mu.
	ckpt *backgroundCheckpoint
	// nextRecheckpoint is when await may next retry the full checkpoint
	// of a broken journal (recheckpoint). Guarded by mu.
	nextRecheckpoint time.Time
	// syncFS syncs the filesystem of the open file fd (unix.Syncfs), nil
	// where syncfs does not report writeback errors (checkpoint.go). Set
	// when the store opens.
	syncFS func(fd int) error
	// checkpointAt is the active journal's length that makes the next
	// change rotate: checkpointBytes, smaller in tests. Guarded by mu.
	checkpointAt int64
	// pool holds the spare files that putRecord writes into. Guarded by
	// recMu (see filePool).
	pool filePool
	// spares are the names of the spare files found at load, adopted
	// into pool once the start's checkpoint succeeds. Guarded by mu.
	spares []string
	// waiters writes the waiters file of a writable store.
	waiters waitersWriter
	// journaledGeneration is the generation mark last appended to the journal; the
	// next checkpoint writes it to the generation file.
	journaledGeneration uint64
	// minCached is the number of records from which the store keeps a
	// record cache (recordcache.go): minCachedRecords, smaller in tests.
	minCached int
	// cacheDone is closed when the background record-cache writer ends;
	// nil while none runs. Guarded by mu.
	cacheDone chan struct{}
	// cacheStop tells the cache writer to give up: the store is closing.
	// Guarded by mu.
	cacheStop bool
	// cacheChanges counts the records written or removed since the cache
	// writer last started; cacheMisses the records read from their files
	// at open. Guarded by mu.
	cacheChanges, cacheMisses int
	// cacheCurrent: the record cache held every record when the store
	// opened, or was written since; with no change since, Close need not
	// write it again. Guarded by mu.
	cacheCurrent bool
	// lastCtime is the newest ctime of a record file stamped, in
	// nanoseconds since the epoch. Guarded by mu.
	lastCtime int64
	// freed is closed when the memory a large load left behind has been
	// returned to the operating system; nil when none is being returned.
	// Set only while the store opens.
	freed chan struct{}
}

var (
	_ leasecore.Store           = (*Store)(nil)
	_ leasecore.BacklogReporter = (*Store)(nil)
	_ engine.Persister          = persister{}
)

// Options configure [Open]: the options every store takes, and the file
// store's own. The zero value works.
type Options struct {
	leasecore.Options
	// NoDaemon, with ReadOnly, says that no daemon serves the directory:
	// handle leases of this host are then reported dead, unless
	// HandleHolders finds a process holding their open file
	// (docs/PROTOCOL.md §2).
	NoDaemon bool
}

// Open opens (creating if needed, mode 0700) the state directory and
// loads its records. Unless opts.ReadOnly, it ends recorded handle leases as
// abandoned (their open files died with the previous daemon, docs/PROTOCOL.md
// §2) and assigns generations to active records written by the reference
// store. With opts.ReadOnly, a state directory that was never served (it
// does not exist, or has no writer-leases directory) is an empty store, and
// nothing is created (docs/PROTOCOL.md §8).
// Unreadable or corrupt records are logged and skipped, never fatal.
// Errors: filesystem errors creating, locking or listing the directory.
func Open(state string, opts Options) (*Store, error) {
	return open(state, opts, nil)
}

// open is [Open], with the engine's persister passed through wrap when
// wrap is not nil (tests spy on the engine's calls).
func open(state string, opts Options, wrap func(engine.Persister) engine.Persister) (*Store, error) {
	recorded := opts.ReadOnly && opts.LeaseDuration <= 0
	opts.Options = opts.Options.WithDefaults()
	s := &Store{opts: opts, state: state, dir: filepath.Join(state, LeasesDir), dirty: make(map[string]struct{}), lagging: make(map[string]laggingRecord),
		checkpointAt: checkpointBytes, minCached: minCachedRecords}
	if syncfsReportsErrors() {
		s.syncFS = unix.Syncfs
	}
	if opts.ReadOnly {
		// Without writer-leases (or without the state directory itself) no
		// daemon ever wrote here: the store is empty and stays untouched.
		// Any other failure, such as ENOTDIR or EACCES, is reported by
		// openFiles.
		if _, err := os.Stat(s.dir); errors.Is(err, fs.ErrNotExist) {
			s.startEngine(wrap)
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
	s.startEngine(wrap)
	if err := s.load(); err != nil {
		s.closeFiles()
		return nil, err
	}
	if !opts.ReadOnly {
		// Start a fresh journal epoch with every replayed change in the
		// records. On failure (a full disk) the store still opens: the
		// journal is kept as it is, and the first change checkpoints.
		err := s.fullCheckpoint()
		if err != nil {
			s.opts.Logger.Warn("cannot checkpoint the journal at start; changes will retry", "err", err)
		}
		// A previous daemon's spares are garbage once the checkpoint has
		// made every name in the directory durable: no crash can bring
		// back a record name that pointed to one of them.
		s.adoptSpares(err == nil)
		s.startWaitersWriter()
		s.startFlusher()
		s.seam.StartReaper()
		if s.cacheMisses >= max(s.seam.Len()/8, 1) {
			s.seam.Lock()
			s.refreshRecordCache()
			s.seam.Unlock()
		}
		if s.freed != nil {
			// The resident size a started daemon reports is after the
			// load's garbage went back.
			<-s.freed
		}
	}
	return s, nil
}

// Close stops the store (see [leasecore.Store.Close]): it stops the background
// record-cache writer, commits what is pending, checkpoints and writes the
// record cache.
func (s *Store) Close() error {
	s.stopRecordCache()
	s.stopFlusher()
	return s.Engine.Close()
}

// startEngine makes the store's engine, with the options as settled, over
// the store's persister (passed through wrap when not nil).
func (s *Store) startEngine(wrap func(engine.Persister) engine.Persister) {
	var p engine.Persister = persister{s}
	if wrap != nil {
		p = wrap(p)
	}
	s.Engine, s.seam = engine.New(engine.Options{Options: s.opts.Options, NoDaemon: s.opts.NoDaemon}, p)
}

func (s *Store) openFiles() error {
	if s.opts.ReadOnly {
		if _, err := os.Stat(s.dir); err != nil {
			return fmt.Errorf("filestore: open store: %w", err)
		}
	} else {
		for _, d := range []string{s.state, s.dir} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				return fmt.Errorf("filestore: create state directory: %w", err)
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
	// O_NONBLOCK: a FIFO in the lock's place must not block the open
	// (flock(2) blocks or not by LOCK_NB alone); it is refused below.
	s.lockFile, err = os.OpenFile(filepath.Join(s.dir, storeLockName), flags|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
	if err != nil && !(s.opts.ReadOnly && errors.Is(err, fs.ErrNotExist)) {
		return fmt.Errorf("filestore: open store lock: %w", err)
	}
	if s.lockFile != nil {
		if st, err := s.lockFile.Stat(); err != nil || !st.Mode().IsRegular() {
			s.lockFile.Close()
			s.lockFile = nil
			return fmt.Errorf("filestore: open store lock: %s is not a regular file", filepath.Join(s.dir, storeLockName))
		}
	}
	// A read-only store without a lock file reads a directory that no
	// writer has used: there is nothing to serialise against.
	if s.dirFile, err = os.Open(s.dir); err != nil {
		return fmt.Errorf("filestore: open store: %w", err)
	}
	if s.stFile, err = os.Open(s.state); err != nil {
		return fmt.Errorf("filestore: open store: %w", err)
	}
	return nil
}

// settleDuration records the lease duration of a writable store in the
// state directory, or, when adopt, takes the recorded one for a read-only
// store.
func (s *Store) settleDuration(adopt bool) error {
	path := filepath.Join(s.state, durationName)
	data, err := readStateFile(path)
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

// close commits what is pending, checkpoints so that the records alone
// hold the state (and the reference store or an older leasefs reads it
// whole), and releases the store's files (persister).
func (s *Store) close() {
	s.stopWaitersWriter()
	s.pool.stop()
	if s.jnl() != nil {
		if err := s.fullCheckpoint(); err != nil {
			s.opts.Logger.Warn("closing the store: checkpoint failed; the journal is replayed at the next start", "err", err)
		}
		// Unless nothing changed since the cache was read or written.
		if !s.cacheCurrent || s.cacheChanges > 0 {
			if s.seam.Len() >= s.minCached {
				waitTimestampTick(s.lastCtime)
			}
			if err := s.writeRecordCache(); err != nil {
				s.opts.Logger.Warn("closing the store: cannot write the record cache; the next start reads every record",
					"path", filepath.Join(s.state, recordCacheName), "err", err)
			}
		}
	}
	s.closeFiles()
}

func (s *Store) closeFiles() {
	s.pool.stop()
	if c := s.ckpt; c != nil {
		<-c.done
	}
	for _, f := range []*os.File{s.lockFile, s.dirFile, s.stFile} {
		if f != nil {
			f.Close()
		}
	}
	for _, j := range []*journal{s.jnl(), s.prev} {
		if j != nil {
			j.close()
		}
	}
}

// lockRecords takes recMu and then the exclusive cross-process store lock
// (the order of docs/ARCHITECTURE.md, "Locks and their order"), and
// returns what releases both. Errors: the flock's; then nothing is held.
func (s *Store) lockRecords() (func(), error) {
	s.recMu.Lock()
	unlock, err := s.flock(unix.LOCK_EX)
	if err != nil {
		s.recMu.Unlock()
		return nil, err
	}
	return func() { unlock(); s.recMu.Unlock() }, nil
}

// flock takes the cross-process store lock, retrying on EINTR, and returns
// its release. The caller holds recMu: the lock belongs to the store's one
// open file description, so a second holder's release would end the first
// one's hold.
func (s *Store) flock(how int) (func(), error) {
	if s.lockFile == nil {
		return func() {}, nil
	}
	for {
		err := unix.Flock(int(s.lockFile.Fd()), how)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EINTR) {
			return nil, fmt.Errorf("filestore: lock store: %w", err)
		}
	}
	return func() { _ = unix.Flock(int(s.lockFile.Fd()), unix.LOCK_UN) }, nil
}

// readLockWait bounds how long a read-only store waits for the shared
// store lock. A writer holds it only for one record write or one chunk of
// written-behind records (flushChunk); a longer hold
// means a writer that cannot let go — a killed daemon stuck in the kernel
// on its own mount, which keeps its descriptors (and locks) until its FUSE
// connection is aborted — and "leasefs ls" must not hang behind it.
const readLockWait = 2 * time.Second

// readLock takes the shared store lock for a read-only load, waiting at
// most readLockWait; after that it reads without the lock (every record is
// replaced by an atomic rename, so each one read is whole) and logs why.
func (s *Store) readLock() func() {
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

// saveGeneration journals the generation high-water mark g; the next
// checkpoint writes it to the generation file (persister).
func (s *Store) saveGeneration(g uint64) error {
	if s.savedGeneration >= g || s.journaledGeneration >= g {
		return nil
	}
	if err := s.journalReady(); err != nil {
		return err
	}
	s.jnl().append(entryGeneration, []byte(strconv.FormatUint(g, 10)))
	s.journaledGeneration = g
	return nil
}
