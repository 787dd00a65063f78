package leasecore

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// freePrefix starts the names of the spare files in writer-leases: files
// that held old versions of records or pruned records, kept to be
// overwritten by the next record change (see [FileStore.putRecord]).
// They are garbage after a crash and removed when a store opens.
const freePrefix = ".free-"

// maxFreeFiles bounds the pool; a file released beyond it is unlinked.
const maxFreeFiles = 1024

// filePool is the FIFO of spare files of a writable FileStore. A file freed
// by a change may be overwritten only once that change is durable: until
// then a crash may bring back the name that pointed to it, and the journal
// entry that would repair that name is not yet on disk. Used with the
// store's mutex held; not safe for concurrent use on its own.
type filePool struct {
	free []freeFile
	// next is the suffix of the next name; it starts at the wall clock in
	// nanoseconds, so that no daemon names a file as a previous one did.
	next uint64
}

type freeFile struct {
	path string
	seq  uint64 // journal sequence number that must be durable first
}

// take returns a spare file to overwrite: the oldest free one whose change
// is durable, or a new empty file. Errors: creating the new file.
func (p *filePool) take(dir string, j *journal) (string, error) {
	if len(p.free) > 0 && p.free[0].seq <= j.durableSeq() {
		f := p.free[0]
		p.free = p.free[1:]
		return f.path, nil
	}
	path := p.name(dir)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return "", err
	}
	return path, f.Close()
}

func (p *filePool) name(dir string) string {
	if p.next == 0 {
		p.next = uint64(time.Now().UnixNano())
	}
	p.next++
	return filepath.Join(dir, freePrefix+strconv.FormatUint(p.next, 10))
}

// release returns path to the pool, reusable once journal entry seq is
// durable; beyond maxFreeFiles it is unlinked instead.
func (p *filePool) release(path string, seq uint64) {
	if len(p.free) >= maxFreeFiles {
		_ = os.Remove(path)
		return
	}
	p.free = append(p.free, freeFile{path: path, seq: seq})
}

// recycle moves the record at record into the pool (rename, no unlink),
// reusable once journal entry seq is durable. A missing record is fine.
// Errors: the rename's.
func (p *filePool) recycle(record, dir string, seq uint64) error {
	if len(p.free) >= maxFreeFiles {
		if err := os.Remove(record); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	path := p.name(dir)
	if err := os.Rename(record, path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	p.free = append(p.free, freeFile{path: path, seq: seq})
	return nil
}

// discard forgets a spare file that could not be used, removing it.
func (p *filePool) discard(path string) { _ = os.Remove(path) }
