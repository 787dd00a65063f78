package filestore

import (
	"github.com/leasefs/leasefs/internal/engine"
	"github.com/leasefs/leasefs/leasecore"

	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// loadBatch is how many directory entries one loading goroutine claims at
// a time.
const loadBatch = 256

// freeAfterLoad is the number of records from which loadRecords of a
// writable store returns the garbage of loading to the operating system at
// once, rather than leaving a daemon's resident size at its loading peak.
const freeAfterLoad = 10000

// loadRecords reads and decodes the records among names (the entries of
// the leases directory) into s.leases and raises s.seam.HighGeneration(). A record that cache
// (the record cache, possibly nil) holds for a file whose stamp is
// unchanged is decoded from the cache; any other is read from its file,
// and counted in s.cacheMisses. Temporary files a crash left are removed
// unless the store is read-only; unreadable and corrupt records are logged
// and skipped. The work is spread over GOMAXPROCS goroutines, each reading
// with its own buffer: opening, reading and decoding a record is
// independent of every other. The caller holds the store lock; s.mu is not
// needed, as nothing else sees the store yet. Errors: opening the leases
// directory.
func (s *Store) loadRecords(names []string, cache *recordCache) error {
	dirFD, err := unix.Open(s.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("filestore: list records: %w", err)
	}
	defer unix.Close(dirFD)
	now, mono := s.opts.Clock.Now(), s.opts.Clock.Mono()

	var slots []int32 // the cache entry of each name, -1 for none
	if cache != nil {
		if slots, err = cache.match(names); err != nil {
			s.opts.Logger.Warn("ignoring the record cache: every record is read from its file", "err", err)
		}
	}
	workers := min(runtime.GOMAXPROCS(0), max(len(names)/loadBatch, 1))
	found := make([][]loaded, workers)
	var next, misses atomic.Int64
	var faulted atomic.Bool // the cache file changed under its mapping
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			intern := interner{}
			defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
			for {
				start := int(next.Add(loadBatch)) - loadBatch
				if start >= len(names) {
					return
				}
				for i := start; i < min(start+loadBatch, len(names)); i++ {
					name := names[i]
					var e loaded
					if slots != nil && slots[i] >= 0 && !faulted.Load() {
						e = s.loadCached(dirFD, name, cache.entry, int(slots[i]), &faulted, intern.get)
					}
					if e.rec == nil {
						e, buf = s.loadRecord(dirFD, name, buf, intern.get)
						if e.rec != nil {
							misses.Add(1)
						}
					}
					if e.rec != nil {
						found[w] = append(found[w], e)
					}
				}
			}
		}()
	}
	wg.Wait()
	s.cacheMisses = int(misses.Load())

	total := 0
	for _, es := range found {
		total += len(es)
	}
	recs := make([]*engine.Record, 0, total)
	for _, es := range found {
		for _, e := range es {
			e.rec.Stamp = e.stamp.pack()
			recs = append(recs, e.rec)
		}
	}
	s.seam.Add(now, mono, recs...)
	if total >= freeAfterLoad && !s.opts.ReadOnly {
		// A read-only store serves a command that exits soon ("leasefs
		// ls"): returning memory would only cost it a collection. A
		// daemon's start returns it on the other core while it indexes
		// and checkpoints; Open waits for it.
		freed := make(chan struct{})
		s.freed = freed
		go func() {
			defer close(freed)
			debug.FreeOSMemory()
		}()
	}
	return nil
}

// loaded is a record read at load and the stamp of its file.
type loaded struct {
	rec   *engine.Record
	stamp recordStamp
}

// loadRecord reads and decodes directory entry name, using buf (returned,
// possibly grown, for the next call). It returns nil for an entry that is
// not a record or cannot be loaded, after logging why, and removes the
// temporary file of a crashed write unless the store is read-only. Safe
// for concurrent use with distinct bufs.
func (s *Store) loadRecord(dirFD int, name string, buf []byte, intern func([]byte) string) (loaded, []byte) {
	if strings.HasPrefix(name, ".lease-") && !strings.HasSuffix(name, ".toml") || strings.HasPrefix(name, freePrefix) {
		// A temporary file left by a crash mid-write: the record it was
		// to replace is intact, so the leftover is garbage.
		if !s.opts.ReadOnly {
			_ = unix.Unlinkat(dirFD, name, 0)
		}
		return loaded{}, buf
	}
	id, ok := strings.CutSuffix(name, ".toml")
	if !ok || leasecore.ValidateLeaseID(id) != nil {
		return loaded{}, buf
	}
	var st unix.Stat_t
	data, err := readRecordAt(dirFD, name, buf, &st)
	if data != nil {
		buf = data[:0]
	}
	if err != nil {
		s.opts.Logger.Warn("skipping unreadable lease record", "path", filepath.Join(s.dir, name), "err", err)
		return loaded{}, buf
	}
	r, err := decodeLoaded(id, data, intern)
	if err != nil {
		s.opts.Logger.Warn("skipping corrupt lease record", "path", filepath.Join(s.dir, name), "err", err)
		return loaded{}, buf
	}
	return loaded{r, stampOf(&st, data)}, buf
}

// loadCached returns the entry of record file name from its copy, entry
// slot of the record cache, or nil when the file is not the one copied (it changed, or is gone) or the copy does not decode: the caller
// then reads the file. The caller has set SetPanicOnFault: a fault reading
// the mapping (the cache file was truncated under it) sets faulted and
// returns nil. Safe for concurrent use.
func (s *Store) loadCached(dirFD int, name string, entry func(int) (cachedRecord, bool), slot int, faulted *atomic.Bool, intern func([]byte) string) (e loaded) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(interface{ Addr() uintptr }); !ok {
				panic(r)
			}
			faulted.Store(true)
			e = loaded{}
		}
	}()
	c, ok := entry(slot)
	if !ok {
		faulted.Store(true)
		return loaded{}
	}
	var st unix.Stat_t
	for {
		err := unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || !c.stamp.sameFile(&st) {
			return loaded{}
		}
		break
	}
	id, _ := strings.CutSuffix(name, ".toml")
	r, err := decodeLoaded(id, c.data, intern)
	if err != nil {
		return loaded{}
	}
	c.stamp.crc = crc32.Checksum(c.data, castagnoli)
	return loaded{r, c.stamp}
}

// decodeLoaded decodes the record data of lease id into a new record.
// Errors: the decoder's, or a lease_id that is not id.
func decodeLoaded(id string, data []byte, intern func([]byte) string) (*engine.Record, error) {
	r := new(engine.Record)
	var err error
	r.Hash, err = leasecore.DecodeRecordInto(&r.Lease, data, intern)
	if err == nil && r.Lease.ID != id {
		err = fmt.Errorf("lease_id %q does not match the file name", r.Lease.ID)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// readRecordAt reads record name of the directory open as dirFD into buf
// (grown as needed) without following symlinks or blocking on special
// files: only a regular file of at most leasecore.MaxRecordBytes is read. It fills
// st with the file's attributes, taken before the read, so that a change
// made while reading makes them differ from the file's next stamp. It
// makes raw system calls, one open, fstat, read and close per record, and
// registers no descriptor with the runtime's poller.
func readRecordAt(dirFD int, name string, buf []byte, st *unix.Stat_t) ([]byte, error) {
	fd, err := openat(dirFD, name)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, st); err != nil {
		return nil, &fs.PathError{Op: "fstat", Path: name, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("not a regular file (mode %#o)", st.Mode&unix.S_IFMT)
	}
	if st.Size > leasecore.MaxRecordBytes {
		return nil, fmt.Errorf("record of %d bytes exceeds %d", st.Size, leasecore.MaxRecordBytes)
	}
	// One byte more than the size, so that the whole record takes one
	// read.
	buf = buf[:0]
	if cap(buf) < int(st.Size)+1 {
		buf = make([]byte, 0, max(int(st.Size)+1, 1024))
	}
	for len(buf) <= leasecore.MaxRecordBytes {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)] // grow
		}
		n, err := unix.Read(fd, buf[len(buf):min(cap(buf), leasecore.MaxRecordBytes+1)])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return buf, &fs.PathError{Op: "read", Path: name, Err: err}
		case n == 0:
			return buf, nil
		}
		buf = buf[:len(buf)+n]
		if int64(len(buf)) == st.Size {
			// Records are replaced by rename, never grown in place: the
			// size fstat gave is the whole record, and the read that would
			// return end-of-file is spared.
			return buf, nil
		}
	}
	return buf, nil
}

// openat opens name in dirFD for reading, refusing symlinks and never
// blocking on a FIFO, retrying on EINTR. It asks not to update the access
// time (O_NOATIME, open(2)): loading would otherwise dirty the inode of
// every record read for the first time since it was written, a journal
// write per record. O_NOATIME needs the file's owner or CAP_FOWNER; for
// anyone else (EPERM) the record is opened without it.
func openat(dirFD int, name string) (int, error) {
	flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC | unix.O_NOATIME
	for {
		fd, err := unix.Openat(dirFD, name, flags, 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EPERM) && flags&unix.O_NOATIME != 0:
			flags &^= unix.O_NOATIME
			continue
		case err != nil:
			return -1, &fs.PathError{Op: "open", Path: name, Err: err}
		}
		return fd, nil
	}
}

// load reads every record, the namespaces and the generation mark.
func (s *Store) load() error {
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
		return fmt.Errorf("filestore: list records: %w", err)
	}
	if !s.opts.ReadOnly {
		names = s.splitSpares(names)
	}
	if _, err := s.dirFile.Seek(0, 0); err != nil {
		return fmt.Errorf("filestore: list records: %w", err)
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
		if err != nil || n > leasecore.MaxGeneration {
			s.opts.Logger.Warn("ignoring corrupt generation file", "path", filepath.Join(s.state, generationName))
		} else {
			s.savedGeneration = n
			s.seam.RaiseGeneration(n)
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
		s.seam.SetServed(s.loadWaiters())
	}

	// The store is not yet shared: the engine is the caller's alone.
	return s.seam.Start()
}
