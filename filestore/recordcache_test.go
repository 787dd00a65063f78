package filestore

import (
	"bytes"
	"context"
	"github.com/leasefs/leasefs/leasecore"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/leasefs/leasefs/internal/syncbuf"
	"github.com/leasefs/leasefs/leasecore/clocktest"
	"golang.org/x/sys/unix"
)

// cachedStore opens the store in state keeping a record cache however few
// records it has.
func cachedStore(t *testing.T, state string, clock *clocktest.FakeClock, opts Options) *Store {
	t.Helper()
	opts.Clock = clock
	s := openStore(t, state, opts)
	s.seam.Lock()
	s.minCached = 1
	s.seam.Unlock()
	return s
}

// holders returns resource → holder pid of the live leases of s.
func holders(t *testing.T, s leasecore.Store) map[string]int {
	t.Helper()
	list, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int)
	for _, l := range list {
		out[l.Resource] = l.HolderPID
	}
	return out
}

// liveRecordPath returns the record file of the live lease on resource.
func liveRecordPath(t *testing.T, s leasecore.Store, state, resource string) string {
	t.Helper()
	l, err := s.Live(context.Background(), resource)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(state, LeasesDir, l.ID+".toml")
}

// TestRecordCacheServesUnchangedRecords: a store reopened after a clean
// close reads its records from the cache, writable and read-only, and
// reads from its file every record the cache does not hold as it is: one
// edited in place by hand (same size, same inode), one written anew, one
// added by hand. A removed record stays removed.
func TestRecordCacheServesUnchangedRecords(t *testing.T) {
	t.Parallel()
	clock := clocktest.NewFakeClock(testStart)
	state := t.TempDir()
	s := cachedStore(t, state, clock, Options{})
	ctx := context.Background()
	for _, r := range []string{"a", "b", "c", "d", "e", "f"} {
		reserve(t, s, r)
	}
	g := reserve(t, s, "ended")
	if _, err := s.Release(ctx, g.Lease.ID, g.Token, leasecore.StatusComplete, nil); err != nil {
		t.Fatal(err)
	}
	pathB, pathC := liveRecordPath(t, s, state, "b"), liveRecordPath(t, s, state, "c")
	pathD := liveRecordPath(t, s, state, "d")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(state, recordCacheName)); err != nil {
		t.Fatalf("no record cache after a clean close: %v", err)
	}

	// Unchanged: every record comes from the cache.
	s = cachedStore(t, state, clock, Options{})
	if s.cacheMisses != 0 {
		t.Fatalf("reopened unchanged: %d records read from their files, want 0", s.cacheMisses)
	}
	want := map[string]int{"a": 4242, "b": 4242, "c": 4242, "d": 4242, "e": 4242, "f": 4242}
	if got := holders(t, s); !mapsEqual(got, want) {
		t.Fatalf("live leases from the cache = %v, want %v", got, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// b edited in place, keeping its size and inode; c replaced by a new
	// file (as an editor that renames does); d removed; g added by
	// copying e's record under a new id.
	editInPlace(t, pathB, "holder_pid = 4242", "holder_pid = 4343")
	data, err := os.ReadFile(pathC)
	if err != nil {
		t.Fatal(err)
	}
	tmp := pathC + ".new"
	if err := os.WriteFile(tmp, bytes.Replace(data, []byte("holder_pid = 4242"), []byte("holder_pid = 77"), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, pathC); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(pathD); err != nil {
		t.Fatal(err)
	}
	ro, err := Open(state, Options{Options: leasecore.Options{ReadOnly: true, Clock: clock, Logger: quietLogger}})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	added := copyRecord(t, ro, state, "e", "g")
	ro.Close()

	want = map[string]int{"a": 4242, "b": 4343, "c": 77, "e": 4242, "f": 4242, "g": 4242}
	for _, readOnly := range []bool{true, false} {
		s, err := Open(state, Options{Options: leasecore.Options{ReadOnly: readOnly, Clock: clock, Logger: quietLogger, Host: "testhost"}})
		if err != nil {
			t.Fatal(err)
		}
		if got := holders(t, s); !mapsEqual(got, want) {
			t.Errorf("readOnly=%v: live leases = %v, want %v (added %s)", readOnly, got, want, added)
		}
		// b, c and g: read from their files.
		if s.cacheMisses != 3 {
			t.Errorf("readOnly=%v: %d records read from their files, want 3 (b, c, g)", readOnly, s.cacheMisses)
		}
		s.Close()
	}
}

// editInPlace replaces old by new (of the same length) in the file at
// path without changing its inode.
func editInPlace(t *testing.T, path, old, new string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	edited := bytes.Replace(data, []byte(old), []byte(new), 1)
	if len(edited) != len(data) || bytes.Equal(edited, data) {
		t.Fatalf("edit of %s: %q not found, or not the same length as %q", path, old, new)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(edited, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// copyRecord writes a copy of the live record of resource from as a new
// lease of resource to, with a new id, and returns that id.
func copyRecord(t *testing.T, s leasecore.Store, state, from, to string) string {
	t.Helper()
	data, err := os.ReadFile(liveRecordPath(t, s, state, from))
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Live(context.Background(), from)
	if err != nil {
		t.Fatal(err)
	}
	id := leasecore.NewLeaseID()
	text := strings.Replace(string(data), l.ID, id, 1)
	text = strings.Replace(text, `thread = "`+from+`"`, `thread = "`+to+`"`, 1)
	if err := os.WriteFile(filepath.Join(state, LeasesDir, id+".toml"), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return id
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestRecordCacheDamagedIsIgnored: a cache that is truncated, corrupted,
// of another version or not a regular file is ignored whole, with one
// warning, and every record is read from its file.
func TestRecordCacheDamagedIsIgnored(t *testing.T) {
	t.Parallel()
	clock := clocktest.NewFakeClock(testStart)
	state := t.TempDir()
	s := cachedStore(t, state, clock, Options{})
	for _, r := range []string{"a", "b", "c"} {
		reserve(t, s, r)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(state, recordCacheName)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0x40
	version := bytes.Clone(good)
	version[16] = 9
	write := func(data []byte) func() error {
		return func() error { return os.WriteFile(path, data, 0o600) }
	}
	target := filepath.Join(t.TempDir(), "cache")
	if err := os.WriteFile(target, good, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, plant := range map[string]func() error{
		"truncated": write(good[:len(good)-3]),
		"flipped":   write(flipped),
		"version":   write(version),
		"empty":     write(nil),
		// Neither waited on nor followed.
		"fifo":      func() error { return unix.Mkfifo(path, 0o600) },
		"directory": func() error { return os.Mkdir(path, 0o700) },
		"symlink":   func() error { return os.Symlink(target, path) },
	} {
		if err := os.RemoveAll(path); err != nil {
			t.Fatal(err)
		}
		if err := plant(); err != nil {
			t.Fatal(err)
		}
		var log syncbuf.Buffer
		s, err := Open(state, Options{Options: leasecore.Options{ReadOnly: true, Clock: clock, Logger: slog.New(slog.NewTextHandler(&log, nil))}})
		if err != nil {
			t.Fatal(err)
		}
		if got := holders(t, s); len(got) != 3 {
			t.Errorf("%s cache: live leases = %v, want a, b, c", name, got)
		}
		if s.cacheMisses != 3 {
			t.Errorf("%s cache: %d records read from their files, want 3", name, s.cacheMisses)
		}
		if n := strings.Count(log.String(), "ignoring the record cache"); n != 1 {
			t.Errorf("%s cache: %d warnings, want 1:\n%s", name, n, log.String())
		}
		s.Close()
		// A cache refused after it was mapped is unmapped: a daemon
		// would otherwise keep it mapped for its whole life.
		maps, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(maps), path) {
			t.Errorf("%s cache: still mapped after the store closed", name)
		}
	}
}

// TestRecordCacheWrittenInBackground: a store that opens with most of its
// records missing from the cache writes a new cache while it serves, and
// Close does not write it again when nothing changed since; a change makes
// Close write it.
func TestRecordCacheWrittenInBackground(t *testing.T) {
	t.Parallel()
	clock := clocktest.NewFakeClock(testStart)
	state := t.TempDir()
	s := cachedStore(t, state, clock, Options{})
	for _, r := range []string{"a", "b", "c", "d"} {
		reserve(t, s, r)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(state, recordCacheName)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	// minCached is set only after the open, so the refresh at open is
	// started here, as the store would start it for 1,000 records.
	s = cachedStore(t, state, clock, Options{})
	if s.cacheMisses != 4 {
		t.Fatalf("%d records read from their files, want 4", s.cacheMisses)
	}
	s.seam.Lock()
	s.refreshRecordCache()
	done := s.cacheDone
	s.seam.Unlock()
	if done == nil {
		t.Fatal("no background cache writer started")
	}
	<-done
	before, err := os.Stat(path)
	if err != nil {
		t.Fatalf("no cache after the background writer: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) {
		t.Error("Close rewrote a cache that nothing had changed since")
	}

	s = cachedStore(t, state, clock, Options{})
	if s.cacheMisses != 0 {
		t.Fatalf("after the background cache: %d records read from their files, want 0", s.cacheMisses)
	}
	reserve(t, s, "e")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if after2, err := os.Stat(path); err != nil || os.SameFile(after, after2) {
		t.Fatalf("Close after a change did not write a new cache (err %v)", err)
	}
	s = cachedStore(t, state, clock, Options{})
	if s.cacheMisses != 0 || len(holders(t, s)) != 5 {
		t.Fatalf("after a change: %d misses, leases %v; want 0 and 5", s.cacheMisses, holders(t, s))
	}
}

// TestRecordCacheCloseStopsWriter: Close stops a background cache writer
// that has not finished and returns; the cache it was writing never
// replaces the previous one half-written.
func TestRecordCacheCloseStopsWriter(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	for _, r := range []string{"a", "b", "c"} {
		reserve(t, s, r)
	}
	s.seam.Lock()
	s.minCached = 1
	s.refreshRecordCache()
	done := s.cacheDone
	s.seam.Unlock() // the writer's first chunk may run now, or Close stop it
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	default:
		t.Fatal("Close returned with the cache writer still running")
	}
	ro, err := Open(state, Options{Options: leasecore.Options{ReadOnly: true, Clock: clock, Logger: quietLogger}})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if ro.cacheMisses != 0 || len(holders(t, ro)) != 3 {
		t.Fatalf("after Close: %d misses, leases %v; want 0 and 3", ro.cacheMisses, holders(t, ro))
	}
}

// TestRecordCacheSeesChangesSinceItWasWritten: while a store serves — or
// after it crashed — the cache of its last clean close is stale for every
// record changed since; a reader of the directory ("leasefs ls") reads
// those from their files and still takes the others from the cache.
func TestRecordCacheSeesChangesSinceItWasWritten(t *testing.T) {
	t.Parallel()
	clock := clocktest.NewFakeClock(testStart)
	state := t.TempDir()
	s := cachedStore(t, state, clock, Options{})
	for _, r := range []string{"x", "y", "z"} {
		reserve(t, s, r)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = cachedStore(t, state, clock, Options{})
	if s.cacheMisses != 0 {
		t.Fatalf("reopened: %d misses, want 0", s.cacheMisses)
	}
	// Reserves and renews a, reserves and ends b, reserves c; renews x.
	renewed, ended, live := journalChanges(t, s, clock)
	x, err := s.Live(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.End(context.Background(), x.ID, leasecore.StatusAbandoned); err != nil {
		t.Fatal(err)
	}
	flushRecords(t, s)
	ro := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, ReadOnly: true}, NoDaemon: true})
	checkChanges(t, ro, renewed, ended, live)
	// a, b and c are not in the cache, x changed since: 4 read from their
	// files, y and z from the cache.
	if ro.cacheMisses != 4 {
		t.Errorf("%d records read from their files, want the 4 changed", ro.cacheMisses)
	}
	if got := holders(t, ro); len(got) != 4 || got["x"] != 0 {
		t.Errorf("live leases = %v, want a, c, y, z", got)
	}
}

// cacheOf writes a record cache of n records with resources of width w in
// a new state directory and returns the directory and the record files'
// names.
func cacheOf(t *testing.T, clock *clocktest.FakeClock, n, w int) (string, []string) {
	t.Helper()
	state := t.TempDir()
	s := cachedStore(t, state, clock, Options{})
	var names []string
	for i := range n {
		g := reserve(t, s, strings.Repeat("x", w)+strconv.Itoa(i))
		names = append(names, g.Lease.ID+".toml")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return state, names
}

// TestRecordCacheChangedWhileMapped: a cache file truncated, or rewritten
// in place with another cache's bytes (cp over it), while it is mapped is
// an error for the matching pass and a miss for a record's copy, never a
// crash: a fault is caught, and lengths that no longer fit are checked.
func TestRecordCacheChangedWhileMapped(t *testing.T) {
	t.Parallel()
	clock := clocktest.NewFakeClock(testStart)
	otherState, _ := cacheOf(t, clock, 150, 250) // longer records, another layout
	otherCache, err := os.ReadFile(filepath.Join(otherState, recordCacheName))
	if err != nil {
		t.Fatal(err)
	}
	for _, change := range []string{"truncated", "rewritten"} {
		t.Run(change, func(t *testing.T) {
			t.Parallel()
			state, names := cacheOf(t, clock, 200, 60)
			path := filepath.Join(state, recordCacheName)
			c, err := readRecordCache(state, len(names))
			if err != nil || c == nil {
				t.Fatalf("readRecordCache = %v, %v", c, err)
			}
			defer c.close()
			slots, err := c.match(slices.Clone(names))
			if err != nil {
				t.Fatal(err)
			}
			if change == "truncated" {
				err = os.Truncate(path, 0)
			} else {
				var f *os.File
				if f, err = os.OpenFile(path, os.O_WRONLY, 0); err == nil {
					_, err = f.WriteAt(otherCache, 0)
					f.Close()
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if change == "truncated" {
				if _, err := c.match(slices.Clone(names)); err == nil {
					t.Error("match over a truncated mapping: no error")
				}
			}
			s := cachedStore(t, state, clock, Options{Options: leasecore.Options{ReadOnly: true}})
			dirFD, err := unix.Open(s.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(dirFD)
			var faulted atomic.Bool
			done := make(chan int)
			go func() {
				defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
				hits := 0
				for i, name := range names {
					// An entry still whole where it was checked is
					// consistent and may be used, if it is this file's.
					if e := s.loadCached(dirFD, name, c.entry, int(slots[i]), &faulted, nil); e.rec != nil {
						hits++
						if e.rec.Lease.ID+".toml" != name {
							t.Errorf("%s: the copy of another record: %s", name, e.rec.Lease.ID)
						}
					}
				}
				done <- hits
			}()
			hits := <-done
			if !faulted.Load() {
				t.Errorf("loadCached over a %s mapping: never faulted (%d hits)", change, hits)
			}
			if change == "truncated" && hits != 0 {
				t.Errorf("loadCached over a truncated mapping: %d hits, want 0", hits)
			}
		})
	}
}
