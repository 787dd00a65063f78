package filestore

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// freePrefix starts the names of the spare files in writer-leases: files
// that held old versions of records or pruned records, kept to be
// overwritten by the next record change (see [Store.putRecord]).
// They are garbage after a crash and removed when a store opens.
const freePrefix = ".free-"

// maxFreeFiles bounds the pool; a file released beyond it is unlinked.
const maxFreeFiles = 1024

// filePool is the FIFO of spare files of a writable Store. A file freed
// by a change may be overwritten only once that change is durable: until
// then a crash may bring back the name that pointed to it, and the journal
// entry that would repair that name is not yet on disk.
//
// Creating a file (an inode allocation) costs far more than overwriting
// and renaming one, and most after many deletions (docs/MEASUREMENTS.md has
// the figures); a lease cycle makes one new record, so a background maker
// keeps a stock of new empty spares ready: the change that needs a file
// takes one instead of creating it under the store's mutex. The maker runs when the stock falls below spareLow, fills
// it to spareStock and ends; [filePool.stop] waits for it.
//
// free and inline are guarded by the store's recMu; made, making and
// stopped by the pool's own mu, a leaf lock (taken under recMu by take,
// alone by the maker, which never takes the store's locks). next is
// atomic.
type filePool struct {
	free []freeFile
	// inline counts the files take had to create itself, for tests.
	inline int
	// next is the suffix of the last name given; it starts at the wall
	// clock in nanoseconds, so that no daemon names a file as a previous
	// one did.
	next atomic.Uint64

	mu sync.Mutex
	// made holds new empty spares, usable at once.
	made []string
	// making: a maker runs; it closes done when it ends.
	making bool
	done   chan struct{}
	// stopped: the store is closing; no maker starts.
	stopped bool
}

const (
	// spareLow is the stock of made spares below which take starts the
	// maker; spareStock the stock it fills to.
	spareLow   = 64
	spareStock = 256
)

type freeFile struct {
	path string
	seq  uint64 // journal sequence number that must be durable first
}

// take returns a spare file to overwrite: the oldest free one whose change
// is durable, else one the maker made, else a new empty file created now.
// Errors: creating the new file.
func (p *filePool) take(dir string, j *journal) (string, error) {
	if len(p.free) > 0 && p.free[0].seq <= j.durableSeq() {
		f := p.free[0]
		p.free = p.free[1:]
		return f.path, nil
	}
	p.mu.Lock()
	var path string
	if n := len(p.made); n > 0 {
		path = p.made[n-1]
		p.made = p.made[:n-1]
	}
	if len(p.made) < spareLow && !p.making && !p.stopped {
		p.making = true
		p.done = make(chan struct{})
		go p.make(dir)
	}
	p.mu.Unlock()
	if path != "" {
		return path, nil
	}
	p.inline++
	return p.create(dir)
}

// create creates a new empty spare under the next free name and returns
// its path. Errors: open(2)'s.
func (p *filePool) create(dir string) (string, error) {
	for {
		path := p.name(dir)
		err := createEmpty(path)
		if !errors.Is(err, fs.ErrExist) {
			return path, err
		}
	}
}

// make creates spares until the stock reaches spareStock, the pool stops,
// or a creation fails (a full disk: the next take reports it).
func (p *filePool) make(dir string) {
	defer close(p.done)
	for {
		p.mu.Lock()
		if p.stopped || len(p.made) >= spareStock {
			p.making = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		path, err := p.create(dir)
		p.mu.Lock()
		if err == nil && !p.stopped {
			p.made = append(p.made, path)
			p.mu.Unlock()
			continue
		}
		p.making = false
		p.mu.Unlock()
		if err == nil {
			p.discard(path)
		}
		return
	}
}

// stop waits for a running maker to end and keeps any other from starting.
// The spares made stay in the directory, for the next store to adopt.
func (p *filePool) stop() {
	p.mu.Lock()
	p.stopped = true
	done := p.done
	p.mu.Unlock()
	if done != nil {
		<-done
	}
}

// splitSpares removes the spare files from names (the entries of the
// leases directory), keeps them in s.spares and returns the rest.
func (s *Store) splitSpares(names []string) []string {
	return slices.DeleteFunc(names, func(name string) bool {
		if strings.HasPrefix(name, freePrefix) {
			s.spares = append(s.spares, strings.Clone(name)) // names share one string (readNames)
			return true
		}
		return false
	})
}

// adoptSpares puts the spare files found at load into the pool, usable at
// once, when ok (the directory has been synced since), until the pool holds
// spareStock ready ones (the maker may have started during the load); it
// removes the others, and any that is not a plain spare: a regular file
// with one link, mode 0600 and this process's owner, as the store creates
// them (a record written into a spare keeps its mode and owner). Names
// given from then on follow the highest adopted one, so that a wall clock
// stepped back since the previous daemon cannot give a name twice.
func (s *Store) adoptSpares(ok bool) {
	dirFD := int(s.dirFile.Fd())
	s.pool.mu.Lock()
	room := spareStock - len(s.pool.made)
	s.pool.mu.Unlock()
	var adopt []string
	var highest uint64
	for _, name := range s.spares {
		var st unix.Stat_t
		if ok && len(adopt) < room &&
			unix.Fstatat(dirFD, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil &&
			st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&0o7777 == 0o600 &&
			st.Nlink == 1 && st.Uid == uint32(os.Geteuid()) {
			adopt = append(adopt, filepath.Join(s.dir, name))
			if n, err := strconv.ParseUint(strings.TrimPrefix(name, freePrefix), 10, 64); err == nil {
				highest = max(highest, n)
			}
			continue
		}
		if err := unix.Unlinkat(dirFD, name, 0); errors.Is(err, unix.EISDIR) || errors.Is(err, unix.EPERM) {
			_ = unix.Unlinkat(dirFD, name, unix.AT_REMOVEDIR) // an empty directory
		}
	}
	s.spares = nil
	for {
		next := s.pool.next.Load()
		if next >= highest || s.pool.next.CompareAndSwap(next, highest) {
			break
		}
	}
	s.pool.mu.Lock()
	s.pool.made = append(s.pool.made, adopt...)
	s.pool.mu.Unlock()
}

// createEmpty creates the empty file path (mode 0600). Errors: open(2)'s,
// as an *os.PathError.
func createEmpty(path string) error {
	fd, err := openRaw(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	return closeRaw(path, fd)
}

// openRaw opens path with open(2), adding O_CLOEXEC and retrying on EINTR,
// and returns the bare descriptor. A store's own files are regular files
// that it writes and closes at once: an *os.File would register each with
// the runtime's poller first (three fcntl(2) and an epoll_ctl(2) that
// fails), syscalls a record write does not need. Errors: open(2)'s, as an
// *os.PathError.
func openRaw(path string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, mode)
		if err == nil {
			return fd, nil
		}
		if err != unix.EINTR {
			return -1, &os.PathError{Op: "open", Path: path, Err: err}
		}
	}
}

// closeRaw closes fd, a descriptor of path from openRaw. Errors: close(2)'s,
// as an *os.PathError.
func closeRaw(path string, fd int) error {
	if err := unix.Close(fd); err != nil {
		return &os.PathError{Op: "close", Path: path, Err: err}
	}
	return nil
}

func (p *filePool) name(dir string) string {
	p.next.CompareAndSwap(0, uint64(time.Now().UnixNano()))
	return filepath.Join(dir, freePrefix+strconv.FormatUint(p.next.Add(1), 10))
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
	for {
		// RENAME_NOREPLACE: a name in use (it cannot be, but a spare must
		// never be replaced unseen) is skipped.
		path := p.name(dir)
		err := unix.Renameat2(unix.AT_FDCWD, record, unix.AT_FDCWD, path, unix.RENAME_NOREPLACE)
		switch {
		case errors.Is(err, unix.EEXIST):
			continue
		case errors.Is(err, fs.ErrNotExist):
			return nil
		case err != nil:
			return err
		}
		p.free = append(p.free, freeFile{path: path, seq: seq})
		return nil
	}
}

// discard forgets a spare file that could not be used, removing it.
func (p *filePool) discard(path string) { _ = os.Remove(path) }
