package leasecore

import (
	"path/filepath"
	"runtime"
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
const (
	// recordLag is how long a written-behind record file may lag its
	// journal entry while the flusher works: 100 ms.
	recordLag = 100 * time.Millisecond
	// flushChunk is how many lagging records the flusher writes per hold
	// of the store's mutex: 8, about half a millisecond of writes here
	// (each is a spare overwritten and renamed), so that a call arriving
	// while it works waits no longer than a change of its own takes. A
	// mutex profile with 64 per hold showed the flusher as the largest
	// holder that others waited for.
	flushChunk = 8
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
func (s *FileStore) writesBehind() bool {
	return s.flusher.kick != nil
}

// LaggingRecords returns how many records are written behind and not yet in
// their files (see [BacklogReporter]); 0 for a read-only or closed store.
func (s *FileStore) LaggingRecords() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.lagging)
}

var _ BacklogReporter = (*FileStore)(nil)

// writeBehind journals data, the new record of l, and leaves its file to
// the flusher (see above). A full disk refuses the change with ENOSPC as
// a direct write would (docs/PROTOCOL.md §4.3, "Choices"). The caller
// holds mu.
func (s *FileStore) writeBehind(l *Lease, data []byte) error {
	if err := s.checkSpace(); err != nil {
		return &PersistError{Op: "write", Path: filepath.Join(s.dir, l.ID+".toml"), Err: err}
	}
	prev, had := s.lagging[l.ID]
	s.lagging[l.ID] = laggingRecord{data: data, fresh: had && prev.fresh || s.leases[l.ID] == nil}
	s.dirty[l.ID] = struct{}{}
	s.jnl().append(entryRecord, data)
	select {
	case s.flusher.kick <- struct{}{}:
	default:
	}
	return nil
}

// flushLagging writes up to max lagging records to their files (all of
// them when max is 0), under the exclusive store lock. A written record's
// stamp becomes its entry's, for the record cache. Errors: the
// *PersistError of the first record that cannot be written; it and the
// records not reached stay lagging, held by the journal. The caller holds
// mu.
func (s *FileStore) flushLagging(max int) error {
	if len(s.lagging) == 0 {
		return nil
	}
	unlock, err := s.flock(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	n := 0
	for id, r := range s.lagging {
		if max > 0 && n == max {
			break
		}
		stamp, err := s.putRecord(id, r.data, r.fresh)
		if err != nil {
			return err
		}
		delete(s.lagging, id)
		if e := s.leases[id]; e != nil {
			e.disk = stamp
		}
		n++
	}
	return nil
}

// startFlusher starts the record flusher of a writable store.
func (s *FileStore) startFlusher() {
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

// flushChunks writes every lagging record, flushChunk per hold of mu.
// Errors: as flushLagging.
func (s *FileStore) flushChunks() error {
	for {
		s.mu.Lock()
		if s.closed {
			// Closing checkpointed and wrote them all.
			s.mu.Unlock()
			return nil
		}
		err := s.flushLagging(flushChunk)
		more := len(s.lagging) > 0
		s.mu.Unlock()
		if err != nil || !more {
			return err
		}
		// Let a caller woken by the unlock take mu before the next chunk.
		runtime.Gosched()
	}
}

// stopFlusher stops the record flusher and waits for it; the records it
// left are written by the checkpoint of Close. The caller must not hold
// mu.
func (s *FileStore) stopFlusher() {
	if s.flusher.stop == nil {
		return
	}
	s.flusher.stopped.Do(func() { close(s.flusher.stop) })
	<-s.flusher.done
}
