package filestore

import (
	"github.com/leasefs/leasefs/internal/engine"
	"github.com/leasefs/leasefs/leasecore"

	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Checkpoints of the file store's journal (see journal.go for the format
// and docs/PROTOCOL.md §4.3): the records changed in an epoch are made
// durable, so that the epoch's entries are no longer needed. A few are
// fdatasynced one by one, and the directory once; from syncfsRecords on,
// the whole filesystem is synced by one syncfs(2).
//
// One syncfs costs one writeback pass and one flush of the device's cache
// (on a journaling filesystem, one journal commit) for the whole epoch,
// where a fdatasync per record costs one each. Measured on an ext4 mounted
// without a journal, a finished epoch of about 4,750 records took 1.2–2.9 s
// of fdatasyncs, during which a one-client lease cycle lost about a fifth
// of its rate and had most of its slow cycles; one syncfs took 0.1–0.18 s.
// The price is that syncfs also writes back other programs' dirty data on
// the same filesystem (as sync(1) -f does): a background checkpoint that
// takes longer, never a slower change. It reports writeback errors only
// since Linux 5.8 (syncfs(2), "Errors"), so older kernels keep the
// per-record fdatasyncs; a syncfs that fails falls back to them, which
// name the record that cannot be synced.
const syncfsRecords = 64

// backgroundCheckpoint syncs the records changed in a finished epoch while
// the next epoch takes the appends. Its fields are written by its goroutine
// before done is closed and read after.
type backgroundCheckpoint struct {
	ids        []string // records changed in the finished epoch
	generation uint64   // generation mark journaled up to then
	done       chan struct{}
	err        error
	// wroteGeneration: the generation file now holds generation.
	wroteGeneration bool
}

// jnl returns the active journal, nil for a read-only store.
func (s *Store) jnl() *journal { return s.jr.Load() }

// await returns once every appended change is durable (persister). After
// a failed commit every later await fails too, reads included, until a
// full checkpoint has made the store's state durable again: a change runs
// one first (journalReady), and so does await itself, at most once per
// recheckpointEvery, so that a store whose disk has recovered serves its
// readers and renewers again without waiting for some other change.
func (s *Store) await() (bool, error) {
	j := s.jnl()
	if j == nil {
		return false, nil
	}
	seq := j.pending()
	waited, err := j.await(seq)
	if err != nil && s.recheckpoint() {
		return s.jnl().await(seq)
	}
	return waited, err
}

// recheckpointEvery bounds how often await retries the full checkpoint of
// a broken journal: 1 s, so that readers on a failing disk get their error
// at once instead of each waiting for a checkpoint that fails.
const recheckpointEvery = time.Second

// recheckpoint runs the full checkpoint that a failed commit calls for,
// unless one ran within recheckpointEvery, and reports whether the journal
// is whole again. It takes mu; the caller holds no lock (await's callers
// do not hold mu: it is the persister method called without it).
func (s *Store) recheckpoint() bool {
	s.seam.Lock()
	defer s.seam.Unlock()
	if s.seam.Closed() {
		return false
	}
	if s.jnl().broken() == nil {
		return true // another caller's checkpoint made it whole
	}
	now := s.opts.Clock.Now()
	if now.Before(s.nextRecheckpoint) {
		return false
	}
	s.nextRecheckpoint = now.Add(recheckpointEvery)
	if err := s.fullCheckpoint(); err != nil {
		return false
	}
	s.opts.Logger.Info("journal whole again: the records hold every change", "path", s.dir)
	return true
}

// journalReady is called before a change is appended. After a failed commit
// it runs a full checkpoint; when the active journal has passed
// checkpointBytes, it hands the appends to the other journal file and
// checkpoints the finished epoch in the background. Errors: a
// *PersistError; the change must then be refused. The caller holds mu but
// not the store lock.
func (s *Store) journalReady() error {
	j := s.jnl()
	switch {
	case j.broken() != nil:
		return s.fullCheckpoint()
	case j.length() > s.checkpointAt:
		return s.rotate()
	}
	return nil
}

// settleCheckpoint waits for the background checkpoint of the previous
// epoch and accounts it; one that failed is run again here. Errors: the
// retry's *PersistError (the previous epoch is then still needed). The
// caller holds mu.
func (s *Store) settleCheckpoint() error {
	c := s.ckpt
	if c == nil {
		return nil
	}
	<-c.done
	if c.err != nil {
		c.err = s.syncChanged(c.ids)
		if c.err != nil {
			return c.err
		}
	}
	if c.wroteGeneration {
		s.savedGeneration = max(s.savedGeneration, c.generation)
	}
	s.ckpt = nil
	return nil
}

// rotate makes the other journal file active with the next epoch, after
// committing everything appended to the current one, and starts the
// background checkpoint of the finished epoch. Errors: *PersistError. The
// caller holds mu.
func (s *Store) rotate() error {
	if err := s.settleCheckpoint(); err != nil {
		return err
	}
	// The finished epoch's checkpoint syncs its records: every one of
	// them must be in its file first.
	if err := s.flushLagging(); err != nil {
		return err
	}
	j := s.jnl()
	if _, err := j.await(j.pending()); err != nil {
		return err
	}
	next := s.prev
	if err := next.reset(j.epoch+1, j.pending()); err != nil {
		return err
	}
	s.prev = j
	s.jr.Store(next)
	c := &backgroundCheckpoint{ids: slices.Collect(maps.Keys(s.dirty)), generation: max(s.journaledGeneration, s.seam.HighGeneration()), done: make(chan struct{})}
	s.dirty = make(map[string]struct{})
	s.ckpt = c
	if s.cacheChanges >= s.seam.Len()/2 {
		// Half the records may have changed since the record cache was
		// written: rewrite it, so that readers of the state directory
		// ("leasefs ls") keep reading few record files.
		s.refreshRecordCache()
	}
	hwSaved := s.savedGeneration
	go func() {
		defer close(c.done)
		if c.err = s.syncChanged(c.ids); c.err != nil {
			return
		}
		if c.generation > hwSaved {
			c.err = s.writeGeneration(c.generation)
			c.wroteGeneration = c.err == nil
		}
	}()
	return nil
}

// fullCheckpoint makes every change durable in the records — the
// previous epoch's and the active one's records fdatasynced, the directory
// synced, the generation file written — and starts new, empty epochs in
// both journal files. Errors: *PersistError; the journal is then kept as
// it is and still needed. The caller holds mu but not the store lock.
func (s *Store) fullCheckpoint() error {
	j := s.jnl()
	// A broken journal may hold only part of what was appended: the
	// records synced below hold it all.
	_, _ = j.await(j.pending())
	if err := s.settleCheckpoint(); err != nil {
		return err
	}
	if err := s.flushLagging(); err != nil {
		return err
	}
	if err := s.syncChanged(slices.Collect(maps.Keys(s.dirty))); err != nil {
		return err
	}
	// The generation file keeps the high-water mark of every lease ever
	// granted, so that a record lost or damaged later cannot let its
	// generation be granted again (fencing tokens only grow).
	if g := max(s.journaledGeneration, s.seam.HighGeneration()); g > s.savedGeneration {
		if err := s.writeGeneration(g); err != nil {
			return err
		}
		s.savedGeneration = g
	}
	// The previous epoch first: while it is being reset, the active one
	// still holds every entry it might be needed for.
	epoch := max(j.epoch, s.prev.epoch) + 1
	if err := s.prev.reset(epoch, j.pending()); err != nil {
		return err
	}
	if err := j.reset(epoch+1, j.pending()); err != nil {
		return err
	}
	s.dirty = make(map[string]struct{})
	return nil
}

// syncChanged makes the records of ids and the records directory durable:
// by one syncfs(2) of the state's filesystem when there are syncfsRecords
// or more and the kernel reports syncfs's writeback errors, else (or when
// that syncfs fails) by syncRecords. Errors: as syncRecords. It does not
// use mu.
func (s *Store) syncChanged(ids []string) error {
	if len(ids) >= syncfsRecords && s.syncFS != nil {
		err := s.syncFS(int(s.dirFile.Fd()))
		if err == nil {
			return nil
		}
		s.opts.Logger.Warn("cannot sync the state's filesystem; syncing the changed records one by one", "path", s.dir, "records", len(ids), "err", err)
	}
	return s.syncRecords(ids)
}

// syncfsReportsErrors reports whether the running kernel's syncfs(2)
// returns the writeback errors of the filesystem: Linux 5.8 and later.
func syncfsReportsErrors() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	return kernelAtLeast(unix.ByteSliceToString(u.Release[:]), 5, 8)
}

// kernelAtLeast reports whether release, a kernel release such as
// "6.18.44-generic", is major.minor or later; false when it does not
// parse.
func kernelAtLeast(release string, major, minor int) bool {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return false
	}
	maj, err1 := strconv.Atoi(parts[0])
	minStr := parts[1]
	if i := strings.IndexFunc(minStr, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minStr = minStr[:i]
	}
	mnr, err2 := strconv.Atoi(minStr)
	if err1 != nil || err2 != nil {
		return false
	}
	return maj > major || maj == major && mnr >= minor
}

// syncRecords fdatasyncs the records of ids that exist and then the
// records directory. A record exchanged meanwhile is covered by the active
// epoch's entry. Errors: *PersistError with Op "sync".
func (s *Store) syncRecords(ids []string) error {
	for _, id := range ids {
		path := filepath.Join(s.dir, id+".toml")
		f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err == nil {
			err = unix.Fdatasync(int(f.Fd()))
			f.Close()
		}
		if err != nil {
			return &leasecore.PersistError{Op: "sync", Path: path, Err: err}
		}
	}
	if err := s.dirFile.Sync(); err != nil {
		return &leasecore.PersistError{Op: "sync", Path: s.dir, Err: err}
	}
	return nil
}

// writeGeneration replaces the generation file with g durably.
func (s *Store) writeGeneration(g uint64) error {
	data := []byte(strconv.FormatUint(g, 10) + "\n")
	return writeFile(s.stFile, filepath.Join(s.state, generationName), data)
}

// replayJournal applies the journals' entries — the previous epoch's, then
// the active one's — on top of the records just read (docs/PROTOCOL.md
// §4.3): they hold every acknowledged change that a crash may have kept out
// of the records. A writable store rewrites those records and keeps the
// journals open for appending; a read-only one only reads them. A torn tail
// (a crash mid-write) is dropped and logged. Errors: opening a writable
// store's journals.
func (s *Store) replayJournal(now time.Time, mono time.Duration) error {
	var js [2]*journal
	var entries [2][]journalEntry
	for i, name := range []string{journalName0, journalName1} {
		path := filepath.Join(s.state, name)
		j, es, torn, err := openJournal(path, !s.opts.ReadOnly)
		if err != nil {
			for _, j := range js {
				if j != nil {
					j.close()
				}
			}
			if s.opts.ReadOnly {
				s.opts.Logger.Warn("cannot read the journal; the records may miss the latest changes", "path", path, "err", err)
				return nil
			}
			return err
		}
		// A read-only store may see the tail that a serving daemon is
		// writing: only a store alone on the directory (a writable one,
		// or a reader that no daemon serves) knows it is torn.
		alone := !s.opts.ReadOnly || s.opts.NoDaemon
		switch {
		case alone && j.headerDamaged:
			s.opts.Logger.Error("the journal's header is damaged: its entries cannot be read, and the changes they held that no checkpoint had written to the records are lost", "path", path)
		case alone && torn:
			s.opts.Logger.Warn("dropping the torn tail of the journal: the bytes after its last valid entry (a crash mid-write leaves them, and nothing in them was acknowledged; otherwise the file was damaged)", "path", path)
		}
		js[i], entries[i] = j, es
	}
	// The active journal has the higher epoch; the other one counts only
	// when it holds the epoch just before.
	active, prev := 0, 1
	if js[1] != nil && (js[0] == nil || js[1].epoch > js[0].epoch) {
		active, prev = 1, 0
	}
	var apply []journalEntry
	if js[prev] != nil && js[active] != nil && js[prev].epoch+1 == js[active].epoch {
		apply = append(apply, entries[prev]...)
	}
	if js[active] != nil {
		apply = append(apply, entries[active]...)
	}
	if !s.opts.ReadOnly {
		// putRecord below appends nothing, but uses the journal.
		s.jr.Store(js[active])
		s.prev = js[prev]
	}
	r := replay(apply, func(reason string) {
		s.opts.Logger.Warn("skipping a malformed journal entry", "reason", reason)
	})
	for id := range r.removed {
		s.seam.Remove(id)
		if !s.opts.ReadOnly {
			if err := removeFile(filepath.Join(s.dir, id+".toml")); err != nil {
				return err
			}
			s.dirty[id] = struct{}{}
		}
	}
	for id, data := range r.records {
		l, hash, err := leasecore.DecodeRecord(data)
		if err != nil {
			continue // reported by replay
		}
		s.seam.Add(now, mono, &engine.Record{Lease: l, Hash: hash})
		if !s.opts.ReadOnly {
			stamp, err := s.putRecord(id, data, false)
			if err != nil {
				return err
			}
			s.seam.SetStamp(id, stamp.pack())
		}
	}
	s.seam.RaiseGeneration(r.generation)
	if s.opts.ReadOnly {
		for _, j := range js {
			if j != nil {
				j.close()
			}
		}
		return nil
	}
	s.journaledGeneration = r.generation
	return nil
}
