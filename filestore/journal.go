package filestore

import (
	"github.com/leasefs/leasefs/leasecore"

	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The journal of a Store (docs/PROTOCOL.md §4.3, "Journal"): the
// write-ahead log that makes a change durable with one fdatasync(2) shared
// by every change that arrived while the previous one ran (group commit),
// instead of a file fsync and a directory fsync per change.
//
// Layout of <state>/journal.0 and <state>/journal.1:
//
//	header: "LEASEFS-JOURNAL\n" (16 bytes), version (uint32 LE, 1), epoch
//	        (uint64 LE), CRC-32C of the preceding 28 bytes (uint32 LE)
//	entry:  payload length (uint32 LE), CRC-32C of epoch (uint64 LE) and
//	        payload (uint32 LE), payload
//	payload: one kind byte and its body:
//	        'R' a whole record as written to writer-leases/<id>.toml
//	        'D' the lease ids of removed (pruned) records, one per line
//	        'G' the generation high-water mark, decimal
//
// Entries follow the header back to back. Replay reads entries until the
// first one that is short, zero-length, oversized or fails its checksum: that
// is the end of the journal (a torn tail of a crash mid-write, or an older
// epoch's leftovers), and everything from there on is ignored. Every write
// (a commit's entries, a new epoch's header) ends with eight zero bytes,
// which the next commit overwrites: valid entries followed by a zero
// length are a clean end, whatever older epochs left further on; valid
// entries followed by anything else are a torn tail.
//
// The two files take turns. When the active one passes checkpointBytes,
// the other starts the next epoch and takes the appends, while a background
// checkpoint fdatasyncs every record changed in the finished epoch and the
// directory; the finished file stays valid until that is done, and the turn
// after waits for it. Replay applies the previous epoch, then the active
// one. A full checkpoint (at open, at close, after a failed commit) syncs
// every changed record and starts a new epoch in both files.
const (
	// journalNames are the two journal files: the active one and the
	// previous epoch's, whose records a background checkpoint syncs.
	journalName0   = "journal.0"
	journalName1   = "journal.1"
	journalMagic   = "LEASEFS-JOURNAL\n"
	journalVersion = 1
	journalHeader  = 32
	entryHeader    = 8
	// journalChunk is how much the journal file grows at a time, written
	// as zeros and synced once, so that the appends of a commit overwrite
	// allocated blocks and fdatasync(2) has no metadata to flush.
	journalChunk = 256 << 10
	// checkpointBytes is the journal size beyond which the next change
	// checkpoints: about 8,000 records of ~500 bytes.
	checkpointBytes = 4 << 20
	// maxEntryBytes bounds an entry's payload on replay; a longer one is
	// corruption.
	maxEntryBytes = leasecore.MaxRecordBytes + 1
	// maxJournalRead bounds how much of a journal file replay reads: the
	// checkpoint size plus a generous allowance for the batch that crossed
	// it.
	maxJournalRead = 4 * checkpointBytes
)

const (
	entryRecord     = 'R'
	entryRemoved    = 'D'
	entryGeneration = 'G'
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// endMark follows the last entry of every write: a zero entry length.
var endMark [entryHeader]byte

// journal appends entries and makes them durable in groups. append is
// called with the store's mutex held; await by any goroutine without it.
// Safe for concurrent use.
//
// Lock order: the store's mu, then journal.mu. The goroutine that leads a
// commit writes and syncs without holding journal.mu.
type journal struct {
	f *os.File

	mu   sync.Mutex
	cond *sync.Cond // signalled when a commit ends
	// epoch is the current epoch; entries of other epochs are invalid.
	epoch uint64
	// off is where the next commit writes; size is the allocated length.
	off, size int64
	// buf holds entries appended and not yet written.
	buf []byte
	// appended is the sequence number of the last appended entry;
	// durable the last one known durable.
	appended, durable uint64
	// syncing: a commit is writing.
	syncing bool
	// ncommits counts commits, for tests.
	ncommits uint64
	// headerDamaged: at open, the file had no valid header but held
	// bytes after the header's place (openJournal).
	headerDamaged bool
	// err is the failure of the last commit, until a checkpoint succeeds:
	// entries after durable may or may not be on disk.
	err error
}

// journalEntry is one replayed entry.
type journalEntry struct {
	kind byte
	body []byte
}

// openJournal opens (creating when create) the journal at path and returns
// it with the entries of its current epoch. A missing journal with !create
// is (nil, nil, nil). torn reports that the last valid entry is followed
// neither by an end mark (zeros) nor by an older epoch's entry: a tail torn
// by a crash mid-write, or damage. Errors: the file's open, read or header errors.
func openJournal(path string, create bool) (j *journal, entries []journalEntry, torn bool, err error) {
	flags := os.O_RDONLY
	if create {
		flags = os.O_RDWR | os.O_CREATE
	}
	// O_NONBLOCK: a FIFO in the journal's place must not block the open;
	// it is refused below as not a regular file.
	f, err := os.OpenFile(path, flags|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0o600)
	if err != nil {
		if !create && errors.Is(err, os.ErrNotExist) {
			return nil, nil, false, nil
		}
		return nil, nil, false, fmt.Errorf("filestore: open journal: %w", err)
	}
	j = &journal{f: f}
	j.cond = sync.NewCond(&j.mu)
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, false, fmt.Errorf("filestore: open journal: %w", err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, nil, false, fmt.Errorf("filestore: open journal: %s is not a regular file", path)
	}
	j.size = st.Size()
	// A journal never holds much more than checkpointBytes of valid
	// entries; whatever lies beyond maxJournalRead is not read (a huge or
	// sparse file must not stall the start or fill the memory).
	data, err := io.ReadAll(io.LimitReader(f, maxJournalRead))
	if err != nil {
		f.Close()
		return nil, nil, false, fmt.Errorf("filestore: read journal: %w", err)
	}
	epoch, ok := parseJournalHeader(data)
	if !ok {
		// A new journal, or one whose header never became durable: no
		// entry in it was ever acknowledged — unless bytes follow the
		// header's place: then the header was damaged over entries that
		// may have been, and which cannot be read without it.
		j.off = journalHeader
		// Nothing may be appended before a checkpoint writes a header.
		j.err = &leasecore.PersistError{Op: "sync", Path: path, Err: errors.New("journal has no header yet")}
		torn = len(bytes.Trim(data, "\x00")) > 0
		j.headerDamaged = len(data) > journalHeader && len(bytes.Trim(data[journalHeader:], "\x00")) > 0
		return j, nil, torn, nil
	}
	j.epoch = epoch
	off := journalHeader
	for {
		e, n := parseEntry(data[off:], epoch)
		if n == 0 {
			break
		}
		entries = append(entries, e)
		off += n
	}
	j.off = int64(off)
	rest := data[off:]
	torn = len(bytes.Trim(rest[:min(len(rest), entryHeader)], "\x00")) > 0 && !olderEntry(rest, epoch)
	return j, entries, torn, nil
}

// olderEntry reports whether data starts with a valid entry of one of the
// eight epochs before epoch: what a journal file written before end marks
// were holds after the entries of its current epoch.
func olderEntry(data []byte, epoch uint64) bool {
	for e := epoch - 1; e+8 >= epoch && e < epoch; e-- {
		if _, n := parseEntry(data, e); n > 0 {
			return true
		}
	}
	return false
}

// parseJournalHeader returns the epoch of a valid header at the start of
// data.
func parseJournalHeader(data []byte) (uint64, bool) {
	if len(data) < journalHeader || string(data[:16]) != journalMagic ||
		binary.LittleEndian.Uint32(data[16:]) != journalVersion ||
		crc32.Checksum(data[:28], castagnoli) != binary.LittleEndian.Uint32(data[28:]) {
		return 0, false
	}
	return binary.LittleEndian.Uint64(data[20:]), true
}

// parseEntry decodes the entry at the start of data, returning it and its
// length, or a length of 0 at the end of the valid entries.
func parseEntry(data []byte, epoch uint64) (journalEntry, int) {
	if len(data) < entryHeader {
		return journalEntry{}, 0
	}
	n := binary.LittleEndian.Uint32(data)
	if n == 0 || n > maxEntryBytes || int(n) > len(data)-entryHeader {
		return journalEntry{}, 0
	}
	payload := data[entryHeader : entryHeader+int(n)]
	if entryChecksum(epoch, payload) != binary.LittleEndian.Uint32(data[4:]) {
		return journalEntry{}, 0
	}
	return journalEntry{kind: payload[0], body: payload[1:]}, entryHeader + int(n)
}

func entryChecksum(epoch uint64, payload []byte) uint32 {
	var e [8]byte
	binary.LittleEndian.PutUint64(e[:], epoch)
	return crc32.Update(crc32.Checksum(e[:], castagnoli), castagnoli, payload)
}

// append adds an entry of kind with body to the next commit and returns its
// sequence number. It does no I/O. The caller holds the store's mu.
func (j *journal) append(kind byte, body []byte) uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	start := len(j.buf)
	j.buf = append(j.buf, make([]byte, entryHeader)...)
	j.buf = append(j.buf, kind)
	j.buf = append(j.buf, body...)
	payload := j.buf[start+entryHeader:]
	binary.LittleEndian.PutUint32(j.buf[start:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(j.buf[start+4:], entryChecksum(j.epoch, payload))
	j.appended++
	return j.appended
}

// pending returns the sequence number of the last appended entry.
func (j *journal) pending() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.appended
}

// length returns the journal's length once the appended entries are
// written.
func (j *journal) length() int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.off + int64(len(j.buf))
}

// broken returns the failure of the last commit, nil once a checkpoint
// has made everything durable again.
func (j *journal) broken() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.err
}

// await returns once entry seq is durable. The first waiter that finds no
// commit running leads one: it writes every appended entry at once and
// fdatasyncs, while later arrivals queue for the next commit. It reports
// whether it waited for a write. Errors: a *PersistError (Op "sync": the
// outcome is unknown) when the commit that held seq failed, or any commit
// since; the caller must not hold the store's mu.
func (j *journal) await(seq uint64) (waited bool, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.durable < seq {
		waited = true
		if j.err != nil {
			return true, j.err
		}
		if j.syncing {
			j.cond.Wait()
			continue
		}
		buf, last, off := j.buf, j.appended, j.off
		j.buf = nil
		j.syncing = true
		j.mu.Unlock()
		err := j.write(append(buf, endMark[:]...), off)
		j.mu.Lock()
		j.syncing = false
		j.ncommits++
		if err != nil {
			j.err = &leasecore.PersistError{Op: "sync", Path: j.f.Name(), Err: err}
		} else {
			j.off += int64(len(buf)) // the end mark is overwritten next
			j.durable = last
		}
		j.cond.Broadcast()
	}
	return waited, nil
}

// write writes buf at off, growing the file first when needed, and
// fdatasyncs. The caller leads the commit and does not hold j.mu; j.size
// is only changed by the leader (and by reset, which waits for it).
func (j *journal) write(buf []byte, off int64) error {
	if end := off + int64(len(buf)); end > j.size {
		size := (end + journalChunk - 1) / journalChunk * journalChunk
		if _, err := j.f.WriteAt(make([]byte, size-j.size), j.size); err != nil {
			return err
		}
		j.size = size
	}
	if _, err := j.f.WriteAt(buf, off); err != nil {
		return err
	}
	for {
		err := unix.Fdatasync(int(j.f.Fd()))
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// reset starts epoch in this file, empty, with seq the sequence number of
// the last entry appended anywhere before (sequence numbers run on across
// the store's journal files): it writes the header, fdatasyncs, and marks
// everything up to seq durable. It waits for a running commit to end; the
// caller holds the store's mu (no append runs) and has made every entry of
// this file's previous epoch redundant. Errors: the write or sync error,
// leaving the journal broken.
func (j *journal) reset(epoch, seq uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.syncing {
		j.cond.Wait()
	}
	var h [journalHeader]byte
	copy(h[:], journalMagic)
	binary.LittleEndian.PutUint32(h[16:], journalVersion)
	binary.LittleEndian.PutUint64(h[20:], epoch)
	binary.LittleEndian.PutUint32(h[28:], crc32.Checksum(h[:28], castagnoli))
	if err := j.write(append(h[:], endMark[:]...), 0); err != nil {
		j.err = &leasecore.PersistError{Op: "sync", Path: j.f.Name(), Err: err}
		j.cond.Broadcast()
		return j.err
	}
	j.epoch = epoch
	j.off = journalHeader
	j.buf = nil
	j.appended, j.durable = seq, seq
	j.err = nil
	j.cond.Broadcast()
	return nil
}

// close closes the journal file.
func (j *journal) close() error { return j.f.Close() }

// replayState is what a journal's entries say about the store, applied on
// top of the records read from writer-leases.
type replayState struct {
	records    map[string][]byte // lease id → the record's latest text
	removed    map[string]bool   // lease ids pruned after their last record
	generation uint64            // generation mark
}

// replay folds entries into their final state. Malformed entries (which a
// valid checksum makes unlikely) are reported through bad and skipped.
func replay(entries []journalEntry, bad func(reason string)) replayState {
	r := replayState{records: map[string][]byte{}, removed: map[string]bool{}}
	for _, e := range entries {
		switch e.kind {
		case entryRecord:
			l, _, err := leasecore.DecodeRecord(e.body)
			if err != nil {
				bad("record entry: " + err.Error())
				continue
			}
			r.records[l.ID] = e.body
			delete(r.removed, l.ID)
		case entryRemoved:
			for id := range strings.SplitSeq(string(e.body), "\n") {
				if leasecore.ValidateLeaseID(id) == nil {
					r.removed[id] = true
					delete(r.records, id)
				}
			}
		case entryGeneration:
			n, err := strconv.ParseUint(string(e.body), 10, 64)
			if err != nil || n > leasecore.MaxGeneration {
				bad("generation entry " + strconv.Quote(string(e.body)))
				continue
			}
			r.generation = max(r.generation, n)
		default:
			bad(fmt.Sprintf("unknown entry kind %q", e.kind))
		}
	}
	return r
}

// durableSeq returns the sequence number of the last durable entry.
func (j *journal) durableSeq() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.durable
}

// commits returns how many commits the journal has run.
func (j *journal) commits() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.ncommits
}
