package filestore

import (
	"github.com/leasefs/leasefs/leasecore"

	"bufio"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/google/renameio/v2"
)

// cacheWriter writes a record cache: a pending file in the state
// directory, renamed over the cache when complete. Not safe for concurrent
// use.
type cacheWriter struct {
	state string
	pf    *renameio.PendingFile
	w     *bufio.Writer
	count uint32
	crc   uint32 // of everything written so far
	err   error
}

func newCacheWriter(state string) (*cacheWriter, error) {
	pf, err := renameio.NewPendingFile(filepath.Join(state, recordCacheName),
		renameio.WithTempDir(state), renameio.WithStaticPermissions(0o600))
	if err != nil {
		return nil, err
	}
	c := &cacheWriter{state: state, pf: pf, w: bufio.NewWriterSize(pf, 256<<10)}
	var h [cacheHeader]byte
	copy(h[:], recordCacheMagic)
	binary.LittleEndian.PutUint32(h[16:], recordCacheVersion)
	c.write(h[:])
	return c, nil
}

func (c *cacheWriter) write(b []byte) {
	if c.err == nil {
		c.crc = crc32.Update(c.crc, castagnoli, b)
		_, c.err = c.w.Write(b)
	}
}

// add appends the record data of lease id, whose file has stamp st.
func (c *cacheWriter) add(id string, st recordStamp, data []byte) {
	var h [cacheEntryHeader]byte
	binary.LittleEndian.PutUint64(h[0:], st.ino)
	binary.LittleEndian.PutUint64(h[8:], uint64(st.mtime))
	binary.LittleEndian.PutUint64(h[16:], uint64(st.ctime))
	binary.LittleEndian.PutUint16(h[24:], uint16(len(id)))
	binary.LittleEndian.PutUint32(h[26:], uint32(len(data)))
	c.write(h[:])
	c.write([]byte(id))
	c.write(data)
	c.count++
}

// commit completes the cache and replaces the previous one (fsync and
// rename); abort discards it. A cache of no entry is not written (a reader
// would refuse it): the previous one is removed instead.
func (c *cacheWriter) commit() error {
	if c.count == 0 {
		c.abort()
		return removeRecordCache(c.state)
	}
	var t [cacheTrailer]byte
	binary.LittleEndian.PutUint32(t[:], c.count)
	c.write(t[:4])
	binary.LittleEndian.PutUint32(t[4:], c.crc)
	if c.err == nil {
		_, c.err = c.w.Write(t[4:])
	}
	if c.err == nil {
		c.err = c.w.Flush()
	}
	if c.err == nil {
		c.err = c.pf.CloseAtomicallyReplace()
	}
	c.abort()
	return c.err
}

func (c *cacheWriter) abort() { _ = c.pf.Cleanup() }

// removeRecordCache removes the record cache of the state directory, if
// there is one.
func removeRecordCache(state string) error {
	err := os.Remove(filepath.Join(state, recordCacheName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// cacheable returns the record of lease id as its file holds it, and the
// file's stamp, when the store knows that stamp: the record encoded anew
// matches the content last written to or read from the file. A record
// ended in memory only, or loaded from a hand-written file, is not
// cacheable, nor is a lease the engine no longer holds. The caller holds
// the engine's lock.
func (s *Store) cacheable(id string) ([]byte, recordStamp, bool) {
	st := unpackStamp(s.seam.Stamp(id))
	if st.ino == 0 {
		return nil, st, false
	}
	l, hash, ok := s.seam.Lookup(id)
	if !ok {
		return nil, st, false
	}
	data := leasecore.EncodeRecord(&l, hash)
	if len(data) != int(st.size) || crc32.Checksum(data, castagnoli) != st.crc {
		return nil, st, false
	}
	return data, st, true
}

// writeRecordCache writes the cache of every cacheable record, or removes
// the cache when the store has fewer than minCached records. Used when the
// store closes; the caller holds mu. Errors: creating or writing the file
// (the previous cache is then left, still checked record by record).
func (s *Store) writeRecordCache() error {
	if s.seam.Len() < s.minCached {
		return removeRecordCache(s.state)
	}
	c, err := newCacheWriter(s.state)
	if err != nil {
		return err
	}
	for _, id := range slices.Sorted(slices.Values(s.seam.IDs())) {
		if data, st, ok := s.cacheable(id); ok {
			c.add(id, st, data)
		}
	}
	return c.commit()
}

// refreshRecordCache starts writing the record cache in the background,
// unless a writer runs or the store is closing: after a start that found
// few records in the cache, and once many records have changed since the
// cache was last written, so that "leasefs ls" while the daemon runs reads
// it too. The writer copies cacheChunk records per hold of mu; each entry
// is consistent on its own (a record and the stamp of its file, taken
// together), which is all the cache needs. The caller holds mu.
func (s *Store) refreshRecordCache() {
	if s.cacheDone != nil || s.cacheStop || s.opts.ReadOnly || s.seam.Len() < s.minCached {
		return
	}
	ids := s.seam.IDs()
	s.cacheChanges = 0
	done := make(chan struct{})
	s.cacheDone = done
	go func() {
		defer close(done)
		slices.Sort(ids) // the cache is in id order
		err := s.writeCacheChunks(ids)
		s.seam.Lock()
		s.cacheDone = nil
		if err == nil {
			// Changes made while it ran are counted in cacheChanges.
			s.cacheCurrent = true
		}
		s.seam.Unlock()
		if err != nil && !errors.Is(err, errCacheStopped) {
			s.opts.Logger.Warn("cannot write the record cache; the next start reads every record", "path", filepath.Join(s.state, recordCacheName), "err", err)
		}
	}()
}

var errCacheStopped = errors.New("store closing")

// writeCacheChunks writes the cache of the records of ids that still exist
// and are cacheable. It takes mu per chunk and gives up when the store is
// closing (errCacheStopped).
func (s *Store) writeCacheChunks(ids []string) error {
	c, err := newCacheWriter(s.state)
	if err != nil {
		return err
	}
	var buf []byte
	type item struct {
		id   string
		st   recordStamp
		from int
	}
	var items []item
	for len(ids) > 0 {
		chunk := ids[:min(cacheChunk, len(ids))]
		ids = ids[len(chunk):]
		buf, items = buf[:0], items[:0]
		s.seam.Lock()
		if s.cacheStop {
			s.seam.Unlock()
			c.abort()
			return errCacheStopped
		}
		for _, id := range chunk {
			if data, st, ok := s.cacheable(id); ok {
				items = append(items, item{id, st, len(buf)})
				buf = append(buf, data...)
			}
		}
		s.seam.Unlock()
		for i, it := range items {
			end := len(buf)
			if i+1 < len(items) {
				end = items[i+1].from
			}
			c.add(it.id, it.st, buf[it.from:end])
		}
		if c.err != nil {
			c.abort()
			return c.err
		}
	}
	return c.commit()
}

// stopRecordCache stops a background cache writer and waits for it. The
// caller must not hold mu.
func (s *Store) stopRecordCache() {
	s.seam.Lock()
	s.cacheStop = true
	done := s.cacheDone
	s.seam.Unlock()
	if done != nil {
		<-done
	}
}
