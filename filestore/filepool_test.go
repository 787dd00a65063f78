package filestore

import (
	"github.com/leasefs/leasefs/leasecore"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// spareFiles returns the names of the spare files in state's leases
// directory.
func spareFiles(t *testing.T, state string) []string {
	t.Helper()
	names, err := os.ReadDir(filepath.Join(state, LeasesDir))
	if err != nil {
		t.Fatal(err)
	}
	var spares []string
	for _, n := range names {
		if strings.HasPrefix(n.Name(), freePrefix) {
			spares = append(spares, n.Name())
		}
	}
	return spares
}

// waitStock waits until the pool's maker has stopped with at least n spares
// made, or fails after a generous deadline (the maker only creates files).
func waitStock(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.pool.mu.Lock()
		made, making := len(s.pool.made), s.pool.making
		s.pool.mu.Unlock()
		if made >= n && !making {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("spare maker: %d made (making %v), want %d", made, making, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSparesMadeInBackground checks that once the maker has stocked the
// pool, new records are written into made spares: the lease cycles that
// follow create no file under the store's mutex.
func TestSparesMadeInBackground(t *testing.T) {
	state := t.TempDir()
	s := openStore(t, state, Options{Options: leasecore.Options{Clock: clocktest.NewFakeClock(testStart)}})
	reserve(t, s, "first") // the first record starts the maker
	waitStock(t, s, spareStock)
	s.seam.Lock()
	inline := s.pool.inline
	s.seam.Unlock()
	const cycles = spareStock - spareLow
	for i := range cycles {
		g := reserve(t, s, "r-"+strconv.Itoa(i))
		if _, err := s.End(t.Context(), g.Lease.ID, leasecore.StatusComplete); err != nil {
			t.Fatal(err)
		}
	}
	flushRecords(t, s)
	s.seam.Lock()
	created := s.pool.inline - inline
	s.seam.Unlock()
	if created != 0 {
		t.Errorf("%d lease cycles created %d files themselves, want 0 (the maker's spares)", cycles, created)
	}
	if got := recordFiles(t, state); got != cycles+1 {
		t.Errorf("%d record files, want %d", got, cycles+1)
	}
}

// TestSparesAdoptedAtStart checks that a store adopts the spares a previous
// one left (after a clean stop or a crash) instead of removing and creating
// them again, and removes what is not a plain spare: a symlink, a file with
// a second link, and spares beyond the stock.
func TestSparesAdoptedAtStart(t *testing.T) {
	state := t.TempDir()
	clock := clocktest.NewFakeClock(testStart)
	s := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
	reserve(t, s, "first")
	waitStock(t, s, spareStock)
	s.Close()
	left := spareFiles(t, state)
	if len(left) < spareStock {
		t.Fatalf("%d spares after close, want at least %d", len(left), spareStock)
	}
	dir := filepath.Join(state, LeasesDir)
	target := filepath.Join(t.TempDir(), "target")
	if err := os.WriteFile(target, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, freePrefix+"symlink")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(target, filepath.Join(dir, freePrefix+"linked")); err != nil {
		t.Fatal(err)
	}
	// A record written into a spare keeps its mode: one readable by
	// others, or a directory, is no spare.
	if err := os.WriteFile(filepath.Join(dir, freePrefix+"readable"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, freePrefix+"readable"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, freePrefix+"dir"), 0o700); err != nil {
		t.Fatal(err)
	}
	// The highest name in use, as a clock stepped back would leave it.
	ahead := freePrefix + "18446744073709000000"
	if err := os.WriteFile(filepath.Join(dir, ahead), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	left = append(left, ahead)

	// A read-only store leaves them all.
	ro := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, ReadOnly: true}})
	ro.Close()
	if got := len(spareFiles(t, state)); got != len(left)+4 {
		t.Fatalf("a read-only open changed the spares: %d, want %d", got, len(left)+4)
	}

	s = openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
	s.pool.mu.Lock()
	adopted := len(s.pool.made)
	s.pool.mu.Unlock()
	if adopted != spareStock {
		t.Errorf("adopted %d spares, want %d", adopted, spareStock)
	}
	for _, name := range []string{"symlink", "linked", "readable", "dir"} {
		if _, err := os.Lstat(filepath.Join(dir, freePrefix+name)); !os.IsNotExist(err) {
			t.Errorf("%s spare not removed: %v", name, err)
		}
	}
	if data, err := os.ReadFile(target); err != nil || string(data) != "keep me" {
		t.Errorf("the symlink's target: %q, %v", data, err)
	}
	if got := len(spareFiles(t, state)); got != spareStock {
		t.Errorf("%d spares after the start, want the %d adopted", got, spareStock)
	}
	// An adopted spare (which may hold an old record) becomes a record
	// whole, and no file is created for it.
	g := reserve(t, s, "second")
	flushRecords(t, s)
	s.seam.Lock()
	inline := s.pool.inline
	s.seam.Unlock()
	if inline != 0 {
		t.Errorf("the reserve created %d files, want 0", inline)
	}
	l, _, err := leasecore.DecodeRecord(readFile(t, recordPath(state, g.Lease.ID)))
	if err != nil || l.Resource != "second" {
		t.Errorf("record of the adopted spare: %+v, %v", l, err)
	}
	if fi, err := os.Stat(recordPath(state, g.Lease.ID)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("record mode: %v, %v; want 0600", fi.Mode(), err)
	}
	s.seam.Lock()
	next := s.pool.name(dir)
	s.seam.Unlock()
	if next <= filepath.Join(dir, ahead) {
		t.Errorf("next spare name %s, want one after the adopted %s", next, ahead)
	}
}

// TestUnwritableSpareIsReplaced checks that a spare that cannot be written
// (here a directory that took a spare's place) costs the change nothing: it
// is written into a new file.
func TestUnwritableSpareIsReplaced(t *testing.T) {
	state := t.TempDir()
	s := openStore(t, state, Options{Options: leasecore.Options{Clock: clocktest.NewFakeClock(testStart)}})
	bad := filepath.Join(state, LeasesDir, freePrefix+"1")
	if err := os.Mkdir(bad, 0o700); err != nil {
		t.Fatal(err)
	}
	s.pool.stop() // no maker: the bad spare is the one taken
	s.pool.mu.Lock()
	s.pool.made = []string{bad}
	s.pool.mu.Unlock()
	g := reserve(t, s, "x")
	flushRecords(t, s)
	l, _, err := leasecore.DecodeRecord(readFile(t, recordPath(state, g.Lease.ID)))
	if err != nil || l.Resource != "x" {
		t.Errorf("record written past an unwritable spare: %+v, %v", l, err)
	}
}

// TestCloseStopsSpareMaker checks that Close waits for a running maker, and
// that nothing is created after it returns.
func TestCloseStopsSpareMaker(t *testing.T) {
	state := t.TempDir()
	s := openStore(t, state, Options{Options: leasecore.Options{Clock: clocktest.NewFakeClock(testStart)}})
	reserve(t, s, "first")
	s.Close()
	s.pool.mu.Lock()
	making := s.pool.making
	s.pool.mu.Unlock()
	if making {
		t.Error("a spare maker still runs after Close")
	}
	n := len(spareFiles(t, state))
	time.Sleep(20 * time.Millisecond)
	if got := len(spareFiles(t, state)); got != n {
		t.Errorf("%d spares after Close, %d a moment later: the maker outlived Close", n, got)
	}
}

// TestPutRecordGuessesWrong checks both fallbacks of putRecord's rename: a
// lease the store knows whose file is gone (exchange finds nothing, so the
// spare is renamed) and a file for a lease it does not know (a plain rename
// would replace it, so the spare is exchanged and the file joins the pool).
func TestPutRecordGuessesWrong(t *testing.T) {
	state := t.TempDir()
	s := openStore(t, state, Options{Options: leasecore.Options{Clock: clocktest.NewFakeClock(testStart)}})
	g := reserve(t, s, "known")
	flushRecords(t, s)
	if err := os.Remove(recordPath(state, g.Lease.ID)); err != nil {
		t.Fatal(err)
	}
	const unknown = "lease-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	if err := os.WriteFile(recordPath(state, unknown), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.seam.Lock()
	free := len(s.pool.free)
	_, err1 := s.putRecord(g.Lease.ID, []byte("known record"), false)
	_, err2 := s.putRecord(unknown, []byte("unknown record"), true)
	freed := len(s.pool.free) - free
	s.seam.Unlock()
	if err1 != nil || err2 != nil {
		t.Fatalf("putRecord: %v, %v", err1, err2)
	}
	for id, want := range map[string]string{g.Lease.ID: "known record", unknown: "unknown record"} {
		if got := string(readFile(t, recordPath(state, id))); got != want {
			t.Errorf("record %s: %q, want %q", id, got, want)
		}
	}
	if freed != 1 {
		t.Errorf("%d files joined the pool, want 1 (the replaced file of the unknown lease)", freed)
	}
}
