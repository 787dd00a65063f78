package filestore

import (
	"github.com/leasefs/leasefs/internal/engine"
	"github.com/leasefs/leasefs/leasecore"

	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/renameio/v2"
	"golang.org/x/sys/unix"
)

// writeFile replaces path atomically and durably: a pending file in the same
// directory, fsync, rename, fsync of the directory (docs/PROTOCOL.md §4.3).
func writeFile(dir *os.File, path string, data []byte) error {
	pf, err := renameio.NewPendingFile(path,
		renameio.WithTempDir(filepath.Dir(path)), renameio.WithStaticPermissions(0o600))
	if err != nil {
		return &leasecore.PersistError{Op: "write", Path: path, Err: err}
	}
	defer pf.Cleanup()
	if _, err := pf.Write(data); err != nil {
		return &leasecore.PersistError{Op: "write", Path: path, Err: err}
	}
	if err := pf.CloseAtomicallyReplace(); err != nil {
		return &leasecore.PersistError{Op: "write", Path: path, Err: err}
	}
	if err := dir.Sync(); err != nil {
		return &leasecore.PersistError{Op: "sync", Path: filepath.Dir(path), Err: err}
	}
	return nil
}

// writeRecord appends the record of l to the journal, which makes it
// durable at the next commit, and replaces its file: written behind by a
// serving store (writebehind.go), at once (a spare file exchanged with it)
// by one whose flusher has not started, while it loads (persister). The
// caller holds mu.
func (s *Store) writeRecord(l *leasecore.Lease, hash string) error {
	if err := s.journalReady(); err != nil {
		return err
	}
	data := leasecore.EncodeRecord(l, hash)
	if s.writesBehind() {
		if err := s.writeBehind(l, data); err != nil {
			return err
		}
		// The file is written later; the flusher records its stamp.
		s.seam.SetStamp(l.ID, engine.Stamp{})
		return nil
	}
	if !s.loading {
		unlock, err := s.lockRecords()
		if err != nil {
			return err
		}
		defer unlock()
	}
	// No record lags here: only a running flusher leaves records lagging.
	stamp, err := s.putRecord(l.ID, data, !s.seam.Has(l.ID))
	if err != nil {
		return err
	}
	s.jnl().append(entryRecord, data)
	s.seam.SetStamp(l.ID, stamp.pack())
	return nil
}

// putRecord writes data as the record of lease id (writeRecordFile) and
// accounts it: the record must be synced at the next checkpoint, and the
// record cache has one more change. It returns the stamp of the record's
// file, zero if it cannot be had (the record is then left out of the
// record cache). Errors: as writeRecordFile. The caller holds mu, recMu
// and the store lock; fresh says whether no file of the record is thought
// to exist yet.
func (s *Store) putRecord(id string, data []byte, fresh bool) (recordStamp, error) {
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
func (s *Store) writeRecordFile(id string, data []byte, fresh bool) (recordStamp, int64, error) {
	path := filepath.Join(s.dir, id+".toml")
	if err := s.checkSpace(); err != nil {
		return recordStamp{}, 0, &leasecore.PersistError{Op: "write", Path: path, Err: err}
	}
	spare, err := s.pool.take(s.dir, s.jnl())
	if err != nil {
		return recordStamp{}, 0, &leasecore.PersistError{Op: "write", Path: path, Err: err}
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
			return recordStamp{}, 0, &leasecore.PersistError{Op: "write", Path: path, Err: err}
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
		return recordStamp{}, 0, &leasecore.PersistError{Op: "write", Path: path, Err: err}
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
func (s *Store) checkSpace() error {
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
func (s *Store) removeRecords(ids []string) error {
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
	unlock, err := s.lockRecords()
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
			return &leasecore.PersistError{Op: "remove", Path: filepath.Join(s.dir, id+".toml"), Err: err}
		}
		s.seam.SetStamp(id, engine.Stamp{})
		s.dirty[id] = struct{}{}
		s.cacheChanges++
	}
	s.jnl().append(entryRemoved, []byte(strings.Join(ids, "\n")))
	return nil
}
