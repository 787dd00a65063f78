package filestore

import (
	"github.com/leasefs/leasefs/leasecore"

	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/BurntSushi/toml"
)

// waitersName is the file in the state directory in which the serving
// daemon publishes its blocked flock waiters per resource, as TOML
// `"resource" = count` lines, for "leasefs ls" and "leasefs status". It is
// advisory: written without fsync, removed when a daemon opens the store,
// and ignored when no daemon serves the directory.
const waitersName = "waiters.toml"

// publishWaiters hands counts to the waiters writer, which rewrites the
// waiters file with the latest counts it was given (persister). It never
// blocks: a burst of enqueues and grants costs one rewrite, off the
// store's mutex.
func (s *Store) publishWaiters(counts map[string]int) {
	s.waiters.mu.Lock()
	s.waiters.next, s.waiters.pending = counts, true
	s.waiters.mu.Unlock()
	select {
	case s.waiters.kick <- struct{}{}:
	default:
	}
}

// waitersInterval is the shortest time between two rewrites of the waiters
// file: a rewrite creates a file, whose cost lands on the commits that
// share its disk, so a burst of grants must cost one rewrite, not one
// each. The counts are advisory, so "leasefs ls" may show them this much
// late.
const waitersInterval = 100 * time.Millisecond

// waitersWriter is the goroutine that writes the waiters file, started by
// a writable store and stopped by close. mu guards next and pending; it is
// a leaf lock, taken under the store's mu by publishWaiters and alone by
// the writer, which never takes another lock while holding it.
type waitersWriter struct {
	mu      sync.Mutex
	next    map[string]int // the counts to write
	pending bool           // next has not been written
	kick    chan struct{}  // capacity 1
	stop    chan struct{}
	done    chan struct{}
}

// startWaitersWriter starts the goroutine that writes the waiters file.
func (s *Store) startWaitersWriter() {
	s.waiters.kick = make(chan struct{}, 1)
	s.waiters.stop = make(chan struct{})
	s.waiters.done = make(chan struct{})
	go func() {
		defer close(s.waiters.done)
		var last time.Time
		for {
			select {
			case <-s.waiters.stop:
				return
			case <-s.waiters.kick:
			}
			// Counts change with every enqueue and grant; the file is
			// rewritten at most once per waitersInterval, with the counts
			// of its end.
			if wait := time.Until(last.Add(waitersInterval)); wait > 0 {
				select {
				case <-s.waiters.stop:
					return
				case <-time.After(wait):
				}
			}
			last = time.Now()
			s.waiters.mu.Lock()
			counts, pending := s.waiters.next, s.waiters.pending
			s.waiters.pending = false
			s.waiters.mu.Unlock()
			if pending {
				s.writeWaiters(counts)
			}
		}
	}()
}

// stopWaitersWriter stops the writer; the file is removed, since the
// waiters die with the daemon.
func (s *Store) stopWaitersWriter() {
	if s.waiters.stop == nil {
		return
	}
	close(s.waiters.stop)
	<-s.waiters.done
	s.waiters.stop = nil
	s.removeWaiters()
}

// writeWaiters rewrites the waiters file with counts (temporary file and
// rename, no fsync). Failures are logged at debug level only: the counts
// are informational.
func (s *Store) writeWaiters(counts map[string]int) {
	path := filepath.Join(s.state, waitersName)
	if len(counts) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.opts.Logger.Debug("removing the waiters file failed", "err", err)
		}
		return
	}
	var b strings.Builder
	for _, r := range slices.Sorted(maps.Keys(counts)) {
		b.WriteString(leasecore.QuoteTOML(r) + " = " + strconv.Itoa(counts[r]) + "\n")
	}
	tmp := filepath.Join(s.state, "."+waitersName+".tmp")
	err := os.WriteFile(tmp, []byte(b.String()), 0o600)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		s.opts.Logger.Debug("writing the waiters file failed", "err", err)
	}
}

// loadWaiters returns the counts in the waiters file of a serving daemon;
// a missing or corrupt file means no waiters.
func (s *Store) loadWaiters() map[string]int {
	out := make(map[string]int)
	data, err := readStateFile(filepath.Join(s.state, waitersName))
	if err != nil {
		return out
	}
	m := make(map[string]int64)
	if _, err := toml.Decode(string(data), &m); err != nil {
		return out
	}
	for r, n := range m {
		if n > 0 && n <= 1<<31-1 {
			out[r] = int(n)
		}
	}
	return out
}

// removeWaiters removes the waiters file of a previous daemon, whose
// waiters died with it.
func (s *Store) removeWaiters() {
	_ = os.Remove(filepath.Join(s.state, waitersName))
	_ = os.Remove(filepath.Join(s.state, "."+waitersName+".tmp"))
}
