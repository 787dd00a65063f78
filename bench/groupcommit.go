package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Shape of the durable in-memory filesystem's journal: entries of
// entryBytes (about a leasefs record) written in a preallocated file of
// journalBytes, wrapping to its start, so fdatasync(2) never has metadata
// to flush.
const (
	entryBytes   = 300
	journalBytes = 64 << 20
)

// groupCommit makes changes durable the cheapest way a daemon can: each
// change appends one entry, and one pwrite + fdatasync covers every change
// that arrived while the previous one ran (group commit). It keeps nothing
// but the position. Safe for concurrent use.
type groupCommit struct {
	f *os.File

	mu      sync.Mutex
	cond    *sync.Cond // signalled when a commit ends
	off     int64      // where the next write goes
	pending int        // entries appended and not yet written
	// appended is the sequence number of the last appended entry, durable
	// the last one known durable.
	appended, durable uint64
	syncing           bool
	err               error
	buf               []byte
}

// newGroupCommit preallocates path with zeros and syncs it.
func newGroupCommit(path string) (*groupCommit, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(make([]byte, journalBytes)); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	g := &groupCommit{f: f}
	g.cond = sync.NewCond(&g.mu)
	return g, nil
}

// commit appends one entry and returns once it is durable: the first
// caller that finds no write in progress leads, writing every pending
// entry and fdatasyncing once. It returns the error of the commit that
// covered the entry.
func (g *groupCommit) commit() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.appended++
	g.pending++
	my := g.appended
	for g.durable < my {
		if g.syncing {
			g.cond.Wait()
			continue
		}
		g.syncing = true
		n, upto := g.pending, g.appended
		g.pending = 0
		size := int64(n * entryBytes)
		if g.off+size > journalBytes {
			g.off = 0
		}
		off := g.off
		g.off += size
		if cap(g.buf) < int(size) {
			g.buf = make([]byte, size)
		}
		buf := g.buf[:size]
		for i := range buf {
			buf[i] = byte(upto)
		}
		g.mu.Unlock()
		_, err := unix.Pwrite(int(g.f.Fd()), buf, off)
		if err == nil {
			err = unix.Fdatasync(int(g.f.Fd()))
		}
		g.mu.Lock()
		g.syncing = false
		g.durable = upto
		if err != nil {
			g.err = fmt.Errorf("journal commit: %w", err)
		}
		g.cond.Broadcast()
	}
	return g.err
}

// close closes the journal file.
func (g *groupCommit) close() error { return g.f.Close() }

// historyKeep is how many ended leases' record files the durable ceiling
// keeps, as leasefs does by default (docs/PROTOCOL.md §4.3, --history-keep).
const historyKeep = 10000

// history writes the one record file per lease that the record format
// requires (docs/PROTOCOL.md §4.3) the cheapest way there is: behind, every
// 100 ms, each a new file of entryBytes written without fsync (the journal
// already holds the change), the oldest removed beyond historyKeep. Safe
// for concurrent use.
type history struct {
	dir string

	mu      sync.Mutex
	pending []uint64 // inode numbers of leases ended since the last write

	// kept (the record files written, oldest first) and seq belong to the
	// writing goroutine alone.
	kept []string
	seq  uint64
}

// newHistory creates dir and starts writing behind until ctx ends.
func newHistory(ctx context.Context, dir string) (*history, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	h := &history{dir: dir}
	go func() {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				h.flush()
			}
		}
	}()
	return h, nil
}

// ended queues the record file of the lease with inode ino.
func (h *history) ended(ino uint64) {
	h.mu.Lock()
	h.pending = append(h.pending, ino)
	h.mu.Unlock()
}

// flush writes the queued record files and prunes the oldest.
func (h *history) flush() {
	h.mu.Lock()
	batch := h.pending
	h.pending = nil
	h.mu.Unlock()
	body := make([]byte, entryBytes)
	for _, ino := range batch {
		h.seq++
		name := filepath.Join(h.dir, fmt.Sprintf("lease-%d-%d.toml", ino, h.seq))
		copy(body, fmt.Sprintf("lease_id = %q\n", name))
		fd, err := unix.Open(name, unix.O_CREAT|unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
		if err != nil {
			continue
		}
		_, _ = unix.Write(fd, body)
		_ = unix.Close(fd)
		h.kept = append(h.kept, name)
	}
	for len(h.kept) > historyKeep {
		_ = unix.Unlink(h.kept[0])
		h.kept = h.kept[1:]
	}
}
