package filestore

import (
	"github.com/leasefs/leasefs/internal/engine"
	"github.com/leasefs/leasefs/internal/sortpar"
	"github.com/leasefs/leasefs/leasecore"

	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The record cache (docs/PROTOCOL.md §4.3, "Record cache"): one file,
// <state>/records.cache, that holds a copy of the record files together
// with the inode number, size, mtime and ctime each file had when its copy
// was taken. Opening a state directory reads it and stats each record
// instead of opening and reading it — one system call instead of four,
// and no page of the record read — and reads the record file itself when
// its stamp differs from the copy's. The cache is never the truth: a
// record it does not hold, or whose file changed since (a hand edit, a
// change made after the copy), is read from its file as before, and a
// damaged cache is ignored whole.
//
// Layout:
//
//	header:  "LEASEFS-RECCACHE" (16 bytes), version (uint32 LE, 1)
//	entry:   inode (uint64 LE), mtime and ctime in nanoseconds since the
//	         epoch (int64 LE each), id length (uint16 LE), record length
//	         (uint32 LE), the lease id, the record exactly as in its file
//	trailer: number of entries (uint32 LE), CRC-32C of everything before
//	         the CRC (uint32 LE)
const (
	recordCacheName    = "records.cache"
	recordCacheMagic   = "LEASEFS-RECCACHE"
	recordCacheVersion = 1
	cacheHeader        = 20
	cacheTrailer       = 8
	cacheEntryHeader   = 30
	// maxRecordCache bounds the cache file read: far beyond the size of a
	// million records.
	maxRecordCache = 2 << 30
	// maxCachedBytes bounds the size of an entry on average: a cache
	// larger than this per record file (a hostile or sparse file) is not
	// read. Records leasefs writes take under 1 KiB.
	maxCachedBytes = 8 << 10
	// minCachedRecords is the number of records from which a writable
	// store keeps a record cache; below it, reading the records costs
	// little more than reading the cache would.
	minCachedRecords = 1000
	// cacheChunk is how many records the background cache writer copies
	// per hold of the store's mutex: 128, each encoded anew to check it
	// against its file's stamp, a fraction of a millisecond in all, so
	// that the calls it holds up wait no longer than a change takes.
	cacheChunk = 128
)

// recordStamp identifies the content of a record file without reading it:
// what stat(2) tells of the file, and the CRC-32C of the content that had
// those attributes. A file whose inode, size, mtime and ctime are all
// unchanged has not been written since (any write or rename of it sets
// its ctime, which no caller can set back). The zero stamp means unknown.
type recordStamp struct {
	ino          uint64
	mtime, ctime int64  // nanoseconds since the epoch
	size         uint32 // bytes; a record has at most leasecore.MaxRecordBytes
	crc          uint32
}

// The stamp of each record file as last written or read is kept with the
// engine's record ([engine.Record.Stamp], guarded by the engine's lock):
// the record cache holds a lease only while it encodes to that content. A
// new lease's record written at once (not behind) is written before the
// engine indexes it, so its stamp is not kept: it is not cacheable until
// its next write, which is only ever less caching, never a wrong one.

// pack returns st as the engine keeps it.
func (st recordStamp) pack() engine.Stamp {
	return engine.Stamp{st.ino, uint64(st.mtime), uint64(st.ctime), uint64(st.size)<<32 | uint64(st.crc)}
}

// unpackStamp returns the recordStamp that pack made p of.
func unpackStamp(p engine.Stamp) recordStamp {
	return recordStamp{ino: p[0], mtime: int64(p[1]), ctime: int64(p[2]), size: uint32(p[3] >> 32), crc: uint32(p[3])}
}

// stampOf returns the stamp of a file with attributes st and content data.
func stampOf(st *unix.Stat_t, data []byte) recordStamp {
	return recordStamp{
		ino: st.Ino, size: uint32(min(st.Size, leasecore.MaxRecordBytes+1)),
		mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(),
		crc: crc32.Checksum(data, castagnoli),
	}
}

// sameFile reports whether st describes the file of stamp r, unchanged.
func (r recordStamp) sameFile(st *unix.Stat_t) bool {
	return r.ino != 0 && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Ino == r.ino &&
		st.Size == int64(r.size) && st.Mtim.Nano() == r.mtime && st.Ctim.Nano() == r.ctime
}

// timestampTick bounds the granularity of file timestamps: filesystems
// stamp changes with a coarse clock (a jiffy, 1–10 ms; since Linux 6.13
// ext4, xfs, btrfs and tmpfs give a file stat(2) has seen a fine-grained
// one). Two writes of a file within one tick may leave it the same mtime
// and ctime.
const timestampTick = 20 * time.Millisecond

// waitTimestampTick returns once the wall clock is a tick past ctime (ns
// since the epoch), the newest ctime the store stamped: a store that
// closes sooner could leave the directory to a hand edit whose ctime
// equals a stamp of the cache, which would then hide it.
func waitTimestampTick(ctime int64) {
	if d := time.Until(time.Unix(0, ctime).Add(timestampTick)); d > 0 {
		time.Sleep(min(d, timestampTick))
	}
}

// cachedRecord is one entry of a record cache as read.
type cachedRecord struct {
	stamp recordStamp
	data  []byte // the record, a slice of the mapped cache file
}

// recordCache is a record cache as read: the file mapped into memory (its
// pages are in the page cache, so mapping costs no copy) and the offset of
// each entry, in the order of their lease ids. Safe for concurrent reads;
// close unmaps it.
type recordCache struct {
	data    []byte
	offsets []uint32
}

// readRecordCache maps the record cache of the state directory, whose
// leases directory has files record files, and checks it whole. A missing
// cache yields nil and no error; a short, damaged or unsorted one, one of
// another version, or one larger than maxCachedBytes per record file
// yields nil and the reason: the records are then read from their files.
// The mapping is read with runtime/debug.SetPanicOnFault, so that a file
// truncated under it is an error, not a crash; see also [recordCache.entry].
func readRecordCache(state string, files int) (c *recordCache, err error) {
	path := filepath.Join(state, recordCacheName)
	// Neither a symlink followed nor a FIFO waited on: only a regular file
	// is a cache.
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%v)", path, st.Mode().Type())
	}
	limit := min(int64(files+1024)*maxCachedBytes, maxRecordCache)
	if st.Size() < cacheHeader+cacheTrailer || st.Size() > limit {
		return nil, fmt.Errorf("%s: %d bytes is no record cache for %d record files", path, st.Size(), files)
	}
	buf, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, &fs.PathError{Op: "mmap", Path: path, Err: err}
	}
	c = &recordCache{data: buf}
	mapped := c // the error returns below set c to nil before this runs
	defer func() {
		if err != nil {
			mapped.close()
			c = nil
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(interface{ Addr() uintptr }); !ok {
				panic(r)
			}
			err = fmt.Errorf("%s: changed while being read", path)
		}
	}()
	body, sum := buf[:len(buf)-4], binary.LittleEndian.Uint32(buf[len(buf)-4:])
	// The count first: a file of zeros (a sparse one) is refused without
	// reading it all.
	if n := int64(binary.LittleEndian.Uint32(body[len(body)-4:])); n*cacheEntryHeader > int64(len(body)) || n == 0 {
		return nil, fmt.Errorf("%s: a count of %d entries does not fit its %d bytes", path, n, len(buf))
	}
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, fmt.Errorf("%s: bad checksum", path)
	}
	if string(body[:16]) != recordCacheMagic || binary.LittleEndian.Uint32(body[16:]) != recordCacheVersion {
		return nil, fmt.Errorf("%s: not a record cache of version %d", path, recordCacheVersion)
	}
	n := int(binary.LittleEndian.Uint32(body[len(body)-4:]))
	c.offsets = make([]uint32, 0, min(n, len(body)/cacheEntryHeader))
	var prev []byte
	for off := cacheHeader; off < len(body)-4; {
		rest := body[off : len(body)-4]
		if len(rest) < cacheEntryHeader {
			return nil, fmt.Errorf("%s: truncated entry", path)
		}
		idLen := int(binary.LittleEndian.Uint16(rest[24:]))
		dataLen := int(binary.LittleEndian.Uint32(rest[26:]))
		if cacheEntryHeader+idLen+dataLen > len(rest) || dataLen > leasecore.MaxRecordBytes {
			return nil, fmt.Errorf("%s: truncated entry", path)
		}
		id := rest[cacheEntryHeader : cacheEntryHeader+idLen]
		if prev != nil && bytes.Compare(prev, id) >= 0 {
			return nil, fmt.Errorf("%s: entries out of order", path)
		}
		prev = id
		c.offsets = append(c.offsets, uint32(off))
		off += cacheEntryHeader + idLen + dataLen
	}
	if len(c.offsets) != n {
		return nil, fmt.Errorf("%s: %d entries, the trailer says %d", path, len(c.offsets), n)
	}
	return c, nil
}

// match sorts names (the entries of the leases directory) and returns,
// for each, the index of its record's entry in the cache, or -1: one pass
// over both in order, which reads the cache sequentially. A fault reading
// the mapping (the file truncated under it) is an error.
func (c *recordCache) match(names []string) (slots []int32, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(interface{ Addr() uintptr }); !ok {
				panic(r)
			}
			slots, err = nil, errors.New("the record cache changed while being read")
		}
	}()
	sortpar.Sort(names, strings.Compare)
	slots = make([]int32, len(names))
	j := 0
	for i, name := range names {
		slots[i] = -1
		id, ok := strings.CutSuffix(name, ".toml")
		if !ok {
			continue
		}
		for j < len(c.offsets) {
			cid, ok := c.id(j)
			if !ok {
				return nil, errors.New("the record cache changed while being read")
			}
			d := compareBytesString(cid, id)
			if d >= 0 {
				if d == 0 {
					slots[i] = int32(j)
					j++
				}
				break
			}
			j++
		}
	}
	return slots, nil
}

// id returns the lease id of entry i, or false when the mapped bytes no
// longer hold an entry there (see entry).
func (c *recordCache) id(i int) ([]byte, bool) {
	e := c.data[c.offsets[i]:]
	if len(e) < cacheEntryHeader {
		return nil, false
	}
	idLen := int(binary.LittleEndian.Uint16(e[24:]))
	if cacheEntryHeader+idLen > len(e) {
		return nil, false
	}
	return e[cacheEntryHeader : cacheEntryHeader+idLen], true
}

// entry returns entry i, or false when the mapped bytes no longer hold an
// entry there: the file was rewritten in place after it was checked (cp
// over it), so its lengths may now point anywhere. An entry that is still
// whole is consistent on its own — a stamp and the content it belongs to —
// whichever file wrote it, so it may be used. The caller reads the mapping
// with SetPanicOnFault set.
func (c *recordCache) entry(i int) (cachedRecord, bool) {
	e := c.data[c.offsets[i]:]
	if len(e) < cacheEntryHeader {
		return cachedRecord{}, false
	}
	idLen := int(binary.LittleEndian.Uint16(e[24:]))
	dataLen := int(binary.LittleEndian.Uint32(e[26:]))
	if dataLen > leasecore.MaxRecordBytes || cacheEntryHeader+idLen+dataLen > len(e) {
		return cachedRecord{}, false
	}
	data := e[cacheEntryHeader+idLen : cacheEntryHeader+idLen+dataLen : cacheEntryHeader+idLen+dataLen]
	return cachedRecord{
		stamp: recordStamp{
			ino:   binary.LittleEndian.Uint64(e),
			mtime: int64(binary.LittleEndian.Uint64(e[8:])),
			ctime: int64(binary.LittleEndian.Uint64(e[16:])),
			size:  uint32(dataLen),
		},
		data: data,
	}, true
}

// compareBytesString compares b and s as strings, without converting.
func compareBytesString(b []byte, s string) int {
	for i := 0; i < len(b) && i < len(s); i++ {
		if b[i] != s[i] {
			return cmp.Compare(b[i], s[i])
		}
	}
	return cmp.Compare(len(b), len(s))
}

// close unmaps the cache; nothing read from it may be used after.
func (c *recordCache) close() {
	if c != nil && c.data != nil {
		_ = unix.Munmap(c.data)
		c.data = nil
	}
}
