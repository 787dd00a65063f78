package filestore

import (
	"github.com/leasefs/leasefs/leasecore"

	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Write-behind of record files (docs/PROTOCOL.md §4.3, "Durability"): a
// change is durable once its journal entry is, and its record file is
// written afterwards, off the path of the system call: by the record
// flusher within recordLag, and in any case before a checkpoint lets the
// journal entry go. A lease changed many times in that window has its file
// written once — a lease reserved and released within it, once, already
// ended. Only what a store does before its flusher starts (the settling of
// a previous daemon's leases at load) and prunes (removals) touch the files
// at once.
//
// Readers of the state directory do not see the lag: "leasefs ls",
// "history" and "status" replay the journal on top of the records under
// the shared store lock, and the flusher writes under the exclusive one,
// so a reader sees each record either before the change, with the change
// in the journal, or after it.
//
// The flusher writes without the store's mutex: it copies a batch of
// lagging records under mu, takes recMu (which every other writer of
// record files takes after mu) before letting mu go, writes the batch
// holding recMu alone, then takes mu again to retire what it wrote. So a
// change arriving meanwhile waits for neither the writes nor the disk:
// it only journals its record and leaves it lagging, with a newer
// version, which a batch retires only when it wrote that version. No
// record write, and no wait on the disk, ever happens under mu.
const (
	// recordLag is how long a written-behind record file may lag its
	// journal entry while the flusher works: 100 ms.
	recordLag = 100 * time.Millisecond
	// flushChunk is how many lagging records the flusher writes per
	// batch: 32, a few milliseconds of writes here (each is a spare
	// overwritten and renamed). Changes do not wait for a batch; a
	// rotation, a prune and "leasefs ls" (the store lock) wait for at
	// most one.
	flushChunk = 32
	// flushRetry is the flusher's pause after a failed write (a full or
	// read-only disk); the records stay in the journal meanwhile.
	flushRetry = time.Second
)

// laggingRecord is a record whose change is journaled and not yet in its
// file.
type laggingRecord struct {
	data []byte
	// fresh: no file of the record exists yet.
	fresh bool
	// version orders the changes written behind (Store.lagVersion):
	// a flusher batch retires the record only if it wrote this one.
	version uint64
}

// recordFlusher is the goroutine that writes lagging records. kick, stop
// and done are set once when it starts; stopping it is safe for
// concurrent use.
type recordFlusher struct {
	kick    chan struct{} // buffered (1): records are lagging
	stop    chan struct{}
	done    chan struct{}
	stopped sync.Once
}

// writesBehind reports whether a change to a record is written behind:
// whenever the flusher runs. The caller holds mu.
func (s *Store) writesBehind() bool {
	return s.flusher.kick != nil
}

// LaggingRecords returns how many records are written behind and not yet in
// their files (see [leasecore.BacklogReporter]); 0 for a read-only or closed store.
func (s *Store) LaggingRecords() int {
	s.seam.Lock()
	defer s.seam.Unlock()
	return len(s.lagging)
}

var _ leasecore.BacklogReporter = (*Store)(nil)

// writeBehind journals data, the new record of l, and leaves its file to
// the flusher (see above). A full disk refuses the change with ENOSPC as
// a direct write would (docs/PROTOCOL.md §4.3, "Choices"). The caller
// holds mu.
func (s *Store) writeBehind(l *leasecore.Lease, data []byte) error {
	if err := s.checkSpace(); err != nil {
		return &leasecore.PersistError{Op: "write", Path: filepath.Join(s.dir, l.ID+".toml"), Err: err}
	}
	prev, had := s.lagging[l.ID]
	s.lagVersion++
	s.lagging[l.ID] = laggingRecord{data: data, fresh: had && prev.fresh || !s.seam.Has(l.ID), version: s.lagVersion}
	s.dirty[l.ID] = struct{}{}
	s.jnl().append(entryRecord, data)
	select {
	case s.flusher.kick <- struct{}{}:
	default:
	}
	return nil
}

// flushLagging writes every lagging record to its file, under recMu and
// the exclusive store lock. A written record's stamp becomes its entry's,
// for the record cache. Errors: the *PersistError of the first record that
// cannot be written; it and the records not reached stay lagging, held by
// the journal. The caller holds mu.
func (s *Store) flushLagging() error {
	if len(s.lagging) == 0 {
		return nil
	}
	unlock, err := s.lockRecords()
	if err != nil {
		return err
	}
	defer unlock()
	for id, r := range s.lagging {
		stamp, err := s.putRecord(id, r.data, r.fresh)
		if err != nil {
			return err
		}
		delete(s.lagging, id)
		s.seam.SetStamp(id, stamp.pack())
	}
	return nil
}

// flushBatch is one batch of the flusher's: up to n lagging records,
// written while the store's mutex is free (see above). It reports whether
// records are still lagging. Errors: as flushLagging. The caller holds
// neither mu nor recMu.
func (s *Store) flushBatch(n int) (more bool, err error) {
	b, ok := s.takeBatch(n)
	if !ok {
		return false, nil
	}
	err = s.writeBatch(b)
	return s.retireBatch(b), err
}

// batchRecord is a lagging record copied into a flusher batch, and what
// writing it gave.
type batchRecord struct {
	id string
	laggingRecord
	written bool
	stamp   recordStamp
	ctime   int64
}

// takeBatch copies up to n lagging records under mu and returns holding
// recMu, with mu released; ok is false (nothing held) when the store is
// closed or nothing lags.
func (s *Store) takeBatch(n int) (b []batchRecord, ok bool) {
	s.seam.Lock()
	defer s.seam.Unlock()
	if s.seam.Closed() || len(s.lagging) == 0 {
		// Closing checkpointed and wrote them all.
		return nil, false
	}
	for id, r := range s.lagging {
		if len(b) == n {
			break
		}
		b = append(b, batchRecord{id: id, laggingRecord: r})
	}
	// While mu is held no other writer of record files can run (they take
	// recMu after mu): none can write these records between the copy and
	// the writes.
	s.recMu.Lock()
	return b, true
}

// writeBatch writes the records of b to their files under the exclusive
// store lock, stopping at the first failure, and releases recMu. Errors:
// that failure's *PersistError. The caller holds recMu, not mu.
func (s *Store) writeBatch(b []batchRecord) error {
	defer s.recMu.Unlock()
	unlock, err := s.flock(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	for i := range b {
		r := &b[i]
		r.stamp, r.ctime, err = s.writeRecordFile(r.id, r.data, r.fresh)
		if err != nil {
			return err
		}
		r.written = true
	}
	return nil
}

// retireBatch accounts the written records of b under mu: each whose
// latest change is the one written stops lagging and takes the stamp of
// its file; one changed since stays lagging, for a later batch. It reports
// whether records are still lagging.
func (s *Store) retireBatch(b []batchRecord) bool {
	s.seam.Lock()
	defer s.seam.Unlock()
	for _, r := range b {
		if !r.written {
			break
		}
		s.cacheChanges++
		s.lastCtime = max(s.lastCtime, r.ctime)
		cur, ok := s.lagging[r.id]
		switch {
		case !ok:
			// Written (or pruned) meanwhile by a rotation or a prune.
		case cur.version == r.version:
			delete(s.lagging, r.id)
			s.seam.SetStamp(r.id, r.stamp.pack())
		case cur.fresh:
			// Changed again while being written: the file exists now.
			cur.fresh = false
			s.lagging[r.id] = cur
		}
	}
	return len(s.lagging) > 0 && !s.seam.Closed()
}

// startFlusher starts the record flusher of a writable store.
func (s *Store) startFlusher() {
	f := &s.flusher
	f.kick = make(chan struct{}, 1)
	f.stop = make(chan struct{})
	f.done = make(chan struct{})
	go func() {
		defer close(f.done)
		failing := false
		for {
			select {
			case <-f.stop:
				return
			case <-f.kick:
			}
			// Changes that arrive while it waits share its writes.
			wait := recordLag
			if failing {
				wait = flushRetry
			}
			select {
			case <-f.stop:
				return
			case <-time.After(wait):
			}
			err := s.flushChunks()
			switch {
			case err != nil && !failing:
				s.opts.Logger.Warn("cannot write lagging records; the journal holds their changes, and writing is retried",
					"path", s.dir, "err", err)
			case err == nil && failing:
				s.opts.Logger.Info("lagging records written again", "path", s.dir)
			}
			if failing = err != nil; failing {
				select {
				case f.kick <- struct{}{}:
				default:
				}
			}
		}
	}()
}

// flushChunks writes every lagging record, flushChunk per batch.
// Errors: as flushLagging.
func (s *Store) flushChunks() error {
	for {
		more, err := s.flushBatch(flushChunk)
		if err != nil || !more {
			return err
		}
	}
}

// stopFlusher stops the record flusher and waits for it; the records it
// left are written by the checkpoint of Close. The caller must not hold
// mu.
func (s *Store) stopFlusher() {
	if s.flusher.stop == nil {
		return
	}
	s.flusher.stopped.Do(func() { close(s.flusher.stop) })
	<-s.flusher.done
}
