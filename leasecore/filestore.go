package leasecore

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	s := &FileStore{state: state, dir: filepath.Join(state, LeasesDir), dirty: make(map[string]struct{}), lagging: make(map[string]laggingRecord),
		checkpointAt: checkpointBytes, minCached: minCachedRecords}
	if syncfsReportsErrors() {
		s.syncFS = unix.Syncfs
	}
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
		s.startReaper()
		if s.cacheMisses >= max(len(s.leases)/8, 1) {
			s.mu.Lock()
			s.refreshRecordCache()
			s.mu.Unlock()
		}
		if s.freed != nil {
			// The resident size a started daemon reports is after the
			// load's garbage went back.
			<-s.freed
		}
	}
	return s, nil
}

// Close stops the store (see [Store.Close]): it stops the background
// record-cache writer, commits what is pending, checkpoints and writes the
// record cache.
func (s *FileStore) Close() error {
	s.stopRecordCache()
	s.stopFlusher()
	return s.store.Close()
}

// maxHeartbeatAge bounds the age of a loaded heartbeat on the monotonic
// clock: about 146 years, past every lease duration. An older one (a
// record's heartbeat_at of 1677, where time.Time.Sub saturates) would make
// "now minus heartbeat" overflow and wrap around to a lease that never
// expires.
const maxHeartbeatAge = time.Duration(1 << 62)

// heartbeatMono places heartbeat hb, read at wall time now and monotonic
// time mono, on the store's monotonic clock: mono less its age, which is
// neither negative (a heartbeat in the future counts as now) nor beyond
// maxHeartbeatAge.
func heartbeatMono(hb, now time.Time, mono time.Duration) time.Duration {
	return mono - min(max(now.Sub(hb), 0), maxHeartbeatAge)
}

// addLoaded indexes a lease read from a record or the journal and returns
// its entry; its heartbeat is placed on the monotonic clock by its age at
// now. The caller holds mu or has the store to itself.
func (s *FileStore) addLoaded(l Lease, hash string, now time.Time, mono time.Duration) *entry {
	e := &entry{lease: l, hash: hash}
	s.fillExpiry(&e.lease)
	e.hbMono = heartbeatMono(e.lease.HeartbeatAt, now, mono)
	s.leases[l.ID] = e
	s.highGeneration = max(s.highGeneration, e.lease.Generation)
	return e
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
	// O_NONBLOCK: a FIFO in the lock's place must not block the open
	// (flock(2) blocks or not by LOCK_NB alone); it is refused below.
	s.lockFile, err = os.OpenFile(filepath.Join(s.dir, storeLockName), flags|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
	if err != nil && !(s.opts.ReadOnly && errors.Is(err, fs.ErrNotExist)) {
		return fmt.Errorf("leasecore: open store lock: %w", err)
	}
	if s.lockFile != nil {
		if st, err := s.lockFile.Stat(); err != nil || !st.Mode().IsRegular() {
			s.lockFile.Close()
			s.lockFile = nil
			return fmt.Errorf("leasecore: open store lock: %s is not a regular file", filepath.Join(s.dir, storeLockName))
		}
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
func (s *FileStore) close() {
	s.stopWaitersWriter()
	s.pool.stop()
	if s.jnl() != nil {
		if err := s.fullCheckpoint(); err != nil {
			s.opts.Logger.Warn("closing the store: checkpoint failed; the journal is replayed at the next start", "err", err)
		}
		// Unless nothing changed since the cache was read or written.
		if !s.cacheCurrent || s.cacheChanges > 0 {
			if len(s.leases) >= s.minCached {
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

func (s *FileStore) closeFiles() {
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

// flock takes the cross-process store lock, retrying on EINTR, and returns
// its release. The caller holds recMu: the lock belongs to the store's one
// open file description, so a second holder's release would end the first
// one's hold.
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
// store lock. A writer holds it only for one record write or one chunk of
// written-behind records (flushChunk); a longer hold
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
		s.recMu.Lock()
		defer s.recMu.Unlock()
		var err error
		if unlock, err = s.flock(unix.LOCK_EX); err != nil {
			return err
		}
		// The records load settles are written under these holds.
		s.loading = true
		defer func() { s.loading = false }()
	}
	defer unlock()

	names, err := readNames(int(s.dirFile.Fd()))
	if err != nil {
		return fmt.Errorf("leasecore: list records: %w", err)
	}
	if !s.opts.ReadOnly {
		names = s.splitSpares(names)
	}
	if _, err := s.dirFile.Seek(0, 0); err != nil {
		return fmt.Errorf("leasecore: list records: %w", err)
	}
	// After the listing: a cache far larger than the records it could
	// hold is refused before it is mapped.
	cache, err := readRecordCache(s.state, len(names))
	if err != nil {
		s.opts.Logger.Warn("ignoring the record cache: every record is read from its file", "err", err)
	}
	err = s.loadRecords(names, cache)
	s.cacheCurrent = cache != nil && s.cacheMisses == 0
	cache.close()
	if err != nil {
		return err
	}
	if data, err := readStateFile(filepath.Join(s.state, generationName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.opts.Logger.Warn("ignoring unreadable generation file", "path", filepath.Join(s.state, generationName), "err", err)
	} else if err == nil {
		n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
		if err != nil || n > MaxGeneration {
			s.opts.Logger.Warn("ignoring corrupt generation file", "path", filepath.Join(s.state, generationName))
		} else {
			s.savedGeneration = n
			s.highGeneration = max(s.highGeneration, n)
		}
	}
	if err := s.replayJournal(s.opts.Clock.Now(), s.opts.Clock.Mono()); err != nil {
		return err
	}
	if !s.opts.ReadOnly {
		// Temporary files of the generation, namespaces and record cache
		// files left by a crash mid-write.
		for _, pattern := range []string{"." + generationName + "*", "." + namespacesName + "*", "." + recordCacheName + "*"} {
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

	// Index active leases. Two active records for one resource cannot both
	// be live: the newer (by generation, then start, then id) wins, whatever
	// the order of the directory.
	order := func(a, b *entry) int {
		return cmp.Or(cmp.Compare(a.lease.Generation, b.lease.Generation),
			a.lease.StartedAt.Compare(b.lease.StartedAt), strings.Compare(a.lease.ID, b.lease.ID))
	}
	var settle []*entry // active entries a writable store must end or rewrite
	if len(s.live) == 0 {
		// Most loaded records are live ones: size the index once rather
		// than growing it through every doubling.
		s.live = make(map[string]*entry, len(s.leases))
	}
	for _, e := range s.leases {
		if e.lease.Status != StatusActive {
			continue
		}
		if prev := s.live[e.lease.Resource]; prev != nil {
			if order(prev, e) > 0 {
				settle = append(settle, e)
				continue
			}
			s.dropLive(prev)
			settle = append(settle, prev)
		}
		s.addLive(e)
		if s.opts.ReadOnly && e.lease.Mode == ModeHandle && e.lease.Host == s.opts.Host && s.opts.HandleHolders != nil {
			// A reader shows a handle lease of a previous daemon that a
			// process still holds as such (docs/PROTOCOL.md §2).
			if pids := s.opts.HandleHolders(e.lease); len(pids) > 0 {
				e.lease.Daemon, e.lease.HolderPIDs = DaemonPrevious, FormatPIDs(pids)
			}
		}
		if e.lease.Mode == ModeHandle && e.lease.Host == s.opts.Host || e.lease.Generation == 0 {
			settle = append(settle, e)
		}
	}
	if s.opts.ReadOnly {
		return nil
	}
	// Settle duplicates and leftovers of a previous daemon in generation
	// order, so that the outcome (the generations given) is deterministic.
	slices.SortFunc(settle, order)
	settle = slices.Compact(settle)
	for _, e := range settle {
		switch {
		case s.live[e.lease.Resource] != e:
			if err := s.endLocked(e, e.lease, StatusAbandoned, ChangeExpired, "superseded by a newer active record", true); err != nil {
				return err
			}
		case e.lease.Mode == ModeHandle && e.lease.Host == s.opts.Host:
			// A daemon ends only its own previous handle leases, and only
			// those whose open file no process holds any more
			// (docs/PROTOCOL.md §2).
			if s.opts.HandleHolders != nil {
				if pids := s.opts.HandleHolders(e.lease); len(pids) > 0 {
					e.lease.Daemon, e.lease.HolderPIDs = DaemonPrevious, FormatPIDs(pids)
					s.opts.Logger.Info("handle lease kept", "resource", e.lease.Resource, "lease", e.lease.ID,
						"generation", e.lease.Generation, "holder_pids", e.lease.HolderPIDs,
						"reason", "a process still holds the open file it was locked on")
					continue
				}
			}
			if err := s.endLocked(e, e.lease, StatusAbandoned, ChangeExpired, "handle lease of a previous daemon", true); err != nil {
				return err
			}
		case e.lease.Generation == 0:
			// A record of the reference store: give it a generation so it
			// has a fencing number and an inode of its own.
			l := e.lease
			l.Generation = s.highGeneration + 1
			stamp, err := s.persist.writeRecord(&l, e.hash)
			if err != nil {
				return err
			}
			s.highGeneration = l.Generation
			e.lease, e.stamp = l, stamp
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

// writeRecord appends the record of l to the journal, which makes it
// durable at the next commit, and replaces its file: written behind by a
// serving store (writebehind.go), at once (a spare file exchanged with it)
// by one whose flusher has not started, while it loads (persister). The
// caller holds mu.
func (s *FileStore) writeRecord(l *Lease, hash string) (recordStamp, error) {
	if err := s.journalReady(); err != nil {
		return recordStamp{}, err
	}
	data := encodeRecord(l, hash)
	if s.writesBehind() {
		return recordStamp{}, s.writeBehind(l, data)
	}
	if !s.loading {
		s.recMu.Lock()
		defer s.recMu.Unlock()
		unlock, err := s.flock(unix.LOCK_EX)
		if err != nil {
			return recordStamp{}, err
		}
		defer unlock()
	}
	// No record lags here: only a running flusher leaves records lagging.
	stamp, err := s.putRecord(l.ID, data, s.leases[l.ID] == nil)
	if err != nil {
		return recordStamp{}, err
	}
	s.jnl().append(entryRecord, data)
	return stamp, nil
}

// putRecord writes data as the record of lease id (writeRecordFile) and
// accounts it: the record must be synced at the next checkpoint, and the
// record cache has one more change. It returns the stamp of the record's
// file, zero if it cannot be had (the record is then left out of the
// record cache). Errors: as writeRecordFile. The caller holds mu, recMu
// and the store lock; fresh says whether no file of the record is thought
// to exist yet.
func (s *FileStore) putRecord(id string, data []byte, fresh bool) (recordStamp, error) {
	stamp, ctime, err := s.writeRecordFile(id, data, fresh)
	if err != nil {
		return recordStamp{}, err
	}
	s.dirty[id] = struct{}{}
	s.cacheChanges++
	s.lastCtime = max(s.lastCtime, ctime)
	return stamp, nil
}

// writeRecordFile writes data as the record of lease id without fsync — the
// journal holds the change durably until a checkpoint syncs the records
// (docs/PROTOCOL.md §4.3). The record is replaced atomically: data is
// written into a spare file of the free pool, which is then exchanged with
// the record (renameat2(2) RENAME_EXCHANGE), or renamed to it for a new
// record (RENAME_NOREPLACE; a lease the store does not know has no record,
// and either guess that proves wrong falls back to the other); the old
// record's file joins the pool. Reusing files this way
// spares the filesystem an inode allocation per change, which costs ten
// times the write on ext4. A failure (ENOSPC, EROFS, EIO) leaves the old
// record in place. It returns the stamp of the record's file (zero if it
// cannot be had) and the file's ctime in nanoseconds. Errors:
// *PersistError. The caller holds recMu and the store lock, and mu unless
// it is the record flusher.
func (s *FileStore) writeRecordFile(id string, data []byte, fresh bool) (recordStamp, int64, error) {
	path := filepath.Join(s.dir, id+".toml")
	if err := s.checkSpace(); err != nil {
		return recordStamp{}, 0, &PersistError{Op: "write", Path: path, Err: err}
	}
	spare, err := s.pool.take(s.dir, s.jnl())
	if err != nil {
		return recordStamp{}, 0, &PersistError{Op: "write", Path: path, Err: err}
	}
	if err := overwrite(spare, data); err != nil {
		// A spare that cannot be written (made immutable by hand, say):
		// a new file of this change's own is.
		s.pool.discard(spare)
		var cerr error
		if spare, cerr = s.pool.create(s.dir); cerr == nil {
			err = overwrite(spare, data)
		}
		if err != nil {
			s.pool.discard(spare)
			return recordStamp{}, 0, &PersistError{Op: "write", Path: path, Err: err}
		}
	}
	flags := uint(unix.RENAME_EXCHANGE)
	if fresh {
		flags = unix.RENAME_NOREPLACE
	}
	for range 2 {
		err = unix.Renameat2(unix.AT_FDCWD, spare, unix.AT_FDCWD, path, flags)
		switch {
		case flags == unix.RENAME_EXCHANGE && errors.Is(err, unix.ENOENT):
			flags = unix.RENAME_NOREPLACE
			continue
		case flags == unix.RENAME_NOREPLACE && errors.Is(err, unix.EEXIST):
			flags = unix.RENAME_EXCHANGE
			continue
		}
		break
	}
	switch {
	case err == nil && flags == unix.RENAME_EXCHANGE:
		// spare now names the old record, free once this change commits.
		s.pool.release(spare, s.jnl().pending()+1)
	case err != nil:
		s.pool.discard(spare)
		return recordStamp{}, 0, &PersistError{Op: "write", Path: path, Err: err}
	}
	// The stamp is taken after the rename, which sets the file's ctime.
	var st unix.Stat_t
	if err := unix.Fstatat(int(s.dirFile.Fd()), id+".toml", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return recordStamp{}, 0, nil
	}
	return stampOf(&st, data), st.Ctim.Nano(), nil
}

// minFreeBytes is the free space below which the store refuses changes
// with ENOSPC: the headroom that lets a checkpoint, the generation and the
// namespaces files always be written, and that makes a full disk refuse
// changes even where a reused file would still take them.
const minFreeBytes = 64 << 10

// checkSpace fails with ENOSPC when the state filesystem has less than
// minFreeBytes free (statfs(2) f_bfree; the daemon runs as root, who may
// use the reserved blocks), and with EROFS when the records directory is
// on a read-only mount (f_flags ST_RDONLY) — which a written-behind change,
// durable through the journal's open descriptor, would not otherwise see.
func (s *FileStore) checkSpace() error {
	var st unix.Statfs_t
	// By path, not by the open directory: a read-only mount stacked on
	// the state directory shows only there.
	if err := unix.Statfs(s.dir, &st); err != nil {
		return err
	}
	if st.Flags&unix.ST_RDONLY != 0 {
		return unix.EROFS
	}
	if st.Bfree*uint64(st.Bsize) < minFreeBytes {
		return unix.ENOSPC
	}
	return nil
}

// maxStateFile bounds what readStateFile reads: 64 MiB, far beyond the
// namespaces file of the largest store.
const maxStateFile = 64 << 20

// errNotRegular is the error of reading a state file that is not a
// regular file (a FIFO, a device, a directory).
var errNotRegular = errors.New("not a regular file")

// readStateFile reads the small state file at path (the namespaces,
// generation, lease-duration and waiters files), at most maxStateFile
// bytes. It never blocks on a FIFO put in its place and refuses anything
// but a regular file. Errors: open(2)'s (fs.ErrNotExist for a missing
// file), an *fs.PathError of errNotRegular, read(2)'s.
func readStateFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return nil, err
	} else if !st.Mode().IsRegular() {
		return nil, &fs.PathError{Op: "read", Path: path, Err: errNotRegular}
	}
	return io.ReadAll(io.LimitReader(f, maxStateFile))
}

// overwrite replaces the content of the existing file at path with data
// (open without O_TRUNC, pwrite, ftruncate: the file keeps its blocks).
// Errors: open(2)'s, pwrite(2)'s (io.ErrShortWrite for a short one),
// ftruncate(2)'s or close(2)'s, as an *os.PathError.
func overwrite(path string, data []byte) error {
	fd, err := openRaw(path, unix.O_WRONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	err = pwriteAll(fd, data)
	if err == nil {
		err = retryEINTR(func() error { return unix.Ftruncate(fd, int64(len(data))) })
	}
	if err != nil {
		err = &os.PathError{Op: "write", Path: path, Err: err}
	}
	if cerr := closeRaw(path, fd); err == nil {
		err = cerr
	}
	return err
}

// pwriteAll writes data at offset 0 of fd, retrying on EINTR. Errors:
// pwrite(2)'s; io.ErrShortWrite when it writes less without an error.
func pwriteAll(fd int, data []byte) error {
	var n int
	err := retryEINTR(func() (err error) {
		n, err = unix.Pwrite(fd, data, 0)
		return err
	})
	if err == nil && n < len(data) {
		err = io.ErrShortWrite
	}
	return err
}

// retryEINTR calls f until it fails with something other than EINTR.
func retryEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

// removeRecords deletes the records of pruned leases and journals their
// removal (persister). Whatever was journaled before — the generation mark
// above all — is made durable first, so that no removal can outlive the
// entries that make it safe. The caller holds mu.
func (s *FileStore) removeRecords(ids []string) error {
	if err := s.journalReady(); err != nil {
		return err
	}
	// Not s.await, which may take mu to retry a checkpoint: journalReady
	// has just run any checkpoint a failed commit called for.
	if j := s.jnl(); j != nil {
		if _, err := j.await(j.pending()); err != nil {
			return err
		}
	}
	s.recMu.Lock()
	defer s.recMu.Unlock()
	unlock, err := s.flock(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	seq := s.jnl().pending() + 1 // the removal entry
	for i, id := range ids {
		// A lagging write of a pruned record is void.
		delete(s.lagging, id)
		if err := s.pool.recycle(filepath.Join(s.dir, id+".toml"), s.dir, seq); err != nil {
			if i > 0 {
				s.jnl().append(entryRemoved, []byte(strings.Join(ids[:i], "\n")))
			}
			return &PersistError{Op: "remove", Path: filepath.Join(s.dir, id+".toml"), Err: err}
		}
		s.dirty[id] = struct{}{}
		s.cacheChanges++
	}
	s.jnl().append(entryRemoved, []byte(strings.Join(ids, "\n")))
	return nil
}

// saveGeneration journals the generation high-water mark g; the next
// checkpoint writes it to the generation file (persister).
func (s *FileStore) saveGeneration(g uint64) error {
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
