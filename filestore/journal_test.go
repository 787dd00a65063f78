package filestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/leasefs/leasefs/leasecore"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/syncbuf"
	"github.com/leasefs/leasefs/leasecore/clocktest"
	"golang.org/x/sys/unix"
)

// crashImage copies the state directory of a store that is still open, as
// a crash of its process would leave it, into a new directory.
func crashImage(t *testing.T, state string) string {
	t.Helper()
	img := t.TempDir()
	err := filepath.WalkDir(state, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(state, p)
		dst := filepath.Join(img, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o700)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, data, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// loseRecords removes every record file from a crash image: what a machine
// crash leaves when none of the records' writes since the last checkpoint
// reached the disk.
func loseRecords(t *testing.T, img string) {
	t.Helper()
	paths, _ := filepath.Glob(filepath.Join(img, LeasesDir, "*.toml"))
	if len(paths) == 0 {
		t.Fatal("crash image holds no record")
	}
	for _, p := range paths {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
}

// journalChanges makes acknowledged changes of every kind in s: a renewed
// lease, an ended one and a live one, and writes their record files as the
// flusher would.
func journalChanges(t *testing.T, s *Store, clock *clocktest.FakeClock) (renewed, ended, live leasecore.Lease) {
	t.Helper()
	ctx := context.Background()
	a := reserve(t, s, "a")
	clock.Advance(2e9)
	l, err := s.Renew(ctx, a.Lease.ID, a.Token, leasecore.Annotations{"path": "/src/a"})
	if err != nil {
		t.Fatal(err)
	}
	b := reserve(t, s, "b")
	e, err := s.Release(ctx, b.Lease.ID, b.Token, leasecore.StatusComplete, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := reserve(t, s, "c")
	flushRecords(t, s)
	return l, e, c.Lease
}

// checkChanges checks that a store opened on a crash image holds the
// changes of journalChanges.
func checkChanges(t *testing.T, s leasecore.Store, renewed, ended, live leasecore.Lease) {
	t.Helper()
	ctx := context.Background()
	got, err := s.Live(ctx, "a")
	if err != nil || got.ID != renewed.ID || !got.HeartbeatAt.Equal(renewed.HeartbeatAt) || got.Path != "/src/a" {
		t.Errorf("renewed lease after the crash = %+v, %v; want heartbeat %v and path /src/a", got, err, renewed.HeartbeatAt)
	}
	if got, err := s.Load(ctx, ended.ID); err != nil || got.Status != leasecore.StatusComplete {
		t.Errorf("released lease after the crash = %+v, %v; want status complete", got, err)
	}
	if got, err := s.Live(ctx, "c"); err != nil || got.ID != live.ID || got.Generation != live.Generation {
		t.Errorf("live lease after the crash = %+v, %v; want %s generation %d", got, err, live.ID, live.Generation)
	}
}

// Every acknowledged change is in the journal: a crash that loses every
// record written since the last checkpoint loses no change, for the
// daemon's store (which rewrites the records and checkpoints) and for a
// read-only one ("leasefs ls" without a daemon).
func TestJournalReplayRestoresLostRecords(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	renewed, ended, live := journalChanges(t, s, clock)

	img := crashImage(t, state)
	loseRecords(t, img)
	ro := openStore(t, img, Options{Options: leasecore.Options{Clock: clock, ReadOnly: true}, NoDaemon: true})
	checkChanges(t, ro, renewed, ended, live)

	rw := openStore(t, img, Options{Options: leasecore.Options{Clock: clock}})
	checkChanges(t, rw, renewed, ended, live)
	for _, id := range []string{renewed.ID, ended.ID, live.ID} {
		if _, err := os.Stat(filepath.Join(img, LeasesDir, id+".toml")); err != nil {
			t.Errorf("record of %s not rewritten from the journal: %v", id, err)
		}
	}
	// The next lease's generation is above every replayed one.
	if g := reserve(t, rw, "d"); g.Lease.Generation <= live.Generation {
		t.Errorf("generation after replay = %d, want > %d", g.Lease.Generation, live.Generation)
	}
}

// A torn tail — an entry cut short or with a bad checksum — is dropped and
// logged, and every entry before it applies.
func TestJournalTornTailDropped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		tear func(journal []byte) []byte
	}{
		{"half an entry appended", func(j []byte) []byte {
			return append(j, 0x40, 0, 0, 0, 1, 2, 3, 4, 'R', 'l', 'e')
		}},
		{"garbage appended", func(j []byte) []byte { return append(j, bytes.Repeat([]byte{0xa5}, 100)...) }},
		{"last byte of the last entry flipped", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, clock, state := newTestStore(t, Options{})
			renewed, ended, live := journalChanges(t, s, clock)
			var flipped leasecore.Lease
			if tc.tear == nil {
				// One more change, whose entry the tear destroys.
				g := reserve(t, s, "torn")
				flipped = g.Lease
			}
			img := crashImage(t, state)
			loseRecords(t, img)
			path := filepath.Join(img, filepath.Base(s.jnl().f.Name()))
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if tc.tear != nil {
				data = tc.tear(bytes.TrimRight(data, "\x00"))
			} else {
				end := len(bytes.TrimRight(data, "\x00"))
				data[end-1] ^= 0xff
			}
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
			var log syncbuf.Buffer
			rw := openStore(t, img, Options{Options: leasecore.Options{Clock: clock, Logger: slog.New(slog.NewTextHandler(&log, nil))}})
			checkChanges(t, rw, renewed, ended, live)
			if !strings.Contains(log.String(), "torn tail of the journal") {
				t.Errorf("no log line about the torn tail; log:\n%s", log.String())
			}
			if flipped.ID != "" {
				if _, err := rw.Load(context.Background(), flipped.ID); !errors.Is(err, leasecore.ErrNotFound) {
					t.Errorf("the lease of the torn entry loaded: %v, want ErrNotFound", err)
				}
			}
		})
	}
}

// A journal whose header is damaged over entries: they cannot be read, and
// the store says so as an error — changes were lost — not as a harmless
// torn tail; so does a reader of the directory that no daemon serves.
func TestJournalDamagedHeaderReported(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	reserve(t, s, "a")
	img := crashImage(t, state)
	path := filepath.Join(img, filepath.Base(s.jnl().f.Name()))
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	copy(data, "XXXX")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, opts := range []Options{{Options: leasecore.Options{Clock: clock, ReadOnly: true}, NoDaemon: true}, {Options: leasecore.Options{Clock: clock}}} {
		var log syncbuf.Buffer
		opts.Logger = slog.New(slog.NewTextHandler(&log, nil))
		openStore(t, img, opts)
		if !strings.Contains(log.String(), "level=ERROR") || !strings.Contains(log.String(), "header is damaged") {
			t.Errorf("read-only %v: no error about the damaged header; log:\n%s", opts.ReadOnly, log.String())
		}
		if strings.Contains(log.String(), "nothing in them was acknowledged") {
			t.Errorf("read-only %v: the damaged header is reported as a harmless torn tail; log:\n%s", opts.ReadOnly, log.String())
		}
	}
}

// The generation file holds the high-water mark from the first
// checkpoint on: when the record of the newest lease is damaged after a
// clean stop, its generation is not granted again (fencing tokens only
// grow, docs/PROTOCOL.md §1).
func TestGenerationSurvivesDamagedRecord(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	reserve(t, s, "a")
	b := reserve(t, s, "b")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "writer-leases", b.Lease.ID+".toml"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
	c := reserve(t, s2, "c")
	if c.Lease.Generation <= b.Lease.Generation {
		t.Errorf("after b's record (generation %d) was damaged, the next lease got generation %d; want more", b.Lease.Generation, c.Lease.Generation)
	}
}

// Changes that arrive while no commit runs share one: three records
// written under the store's lock are made durable by one write and one
// fdatasync.
func TestJournalGroupCommit(t *testing.T) {
	t.Parallel()
	s, clock, _ := newTestStore(t, Options{})
	before := s.jnl().commits()
	s.seam.Lock()
	for _, r := range []string{"x", "y", "z"} {
		l := leasecore.Lease{ID: leasecore.NewLeaseID(), Resource: r, Status: leasecore.StatusActive, Mode: leasecore.ModeToken, Generation: 1,
			StartedAt: clock.Now(), HeartbeatAt: clock.Now()}
		if err := s.writeRecord(&l, leasecore.HashToken(leasecore.NewToken())); err != nil {
			s.seam.Unlock()
			t.Fatal(err)
		}
	}
	s.seam.Unlock()
	if waited, err := s.await(); err != nil || !waited {
		t.Fatalf("await = %v, %v; want a commit", waited, err)
	}
	if n := s.jnl().commits() - before; n != 1 {
		t.Errorf("three appended records took %d commits, want 1", n)
	}
	if waited, err := s.await(); err != nil || waited {
		t.Errorf("await with nothing pending = %v, %v; want no commit", waited, err)
	}
}

// breakJournals makes every write to s's journal files fail (EBADF: they
// are swapped for a read-only descriptor of /dev/null) and returns the
// function that puts the real files back.
func breakJournals(t *testing.T, s *Store) (repair func()) {
	t.Helper()
	bad, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bad.Close() })
	s.seam.Lock()
	j := s.jnl()
	good, goodPrev := j.f, s.prev.f
	j.f, s.prev.f = bad, bad
	s.seam.Unlock()
	return func() {
		s.seam.Lock()
		j.f, s.prev.f = good, goodPrev
		s.seam.Unlock()
	}
}

// A commit that fails leaves the outcome unknown: the caller gets a
// *PersistError that is ErrOutcomeUnknown, the reservation it made is
// ended (its holder never got the token), and once the journal works again
// the next change checkpoints and succeeds.
func TestJournalCommitFailure(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t, Options{})
	ctx := context.Background()
	repair := breakJournals(t, s)
	_, err := s.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1000})
	if !errors.Is(err, leasecore.ErrOutcomeUnknown) {
		t.Fatalf("Reserve with a failing journal: %v, want ErrOutcomeUnknown", err)
	}
	if l, err := s.Live(ctx, "x"); !errors.Is(err, leasecore.ErrNotFound) {
		t.Errorf("the uncommitted reservation is still live: %+v, %v", l, err)
	}
	if _, err := s.Reserve(ctx, leasecore.Draft{Resource: "y", HolderUID: 1000}); err == nil {
		t.Error("Reserve while the journal cannot be reset succeeded")
	}
	repair()
	g := reserve(t, s, "z")
	if _, err := s.Live(ctx, "z"); err != nil {
		t.Errorf("after the journal recovered, Live(z) = %v", err)
	}
	if _, err := s.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Errorf("End after recovery: %v", err)
	}
}

// After a failed commit, reads fail (nothing a crash could undo may be
// shown) until a full checkpoint succeeds; once the disk is back, a read
// runs that checkpoint itself (at most once a second), so a store that only
// serves reads and renewals recovers without waiting for a reservation.
func TestJournalReadsRecoverAfterFailedCommit(t *testing.T) {
	t.Parallel()
	s, clock, _ := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "a")
	repair := breakJournals(t, s)
	if _, err := s.Reserve(ctx, leasecore.Draft{Resource: "x", HolderUID: 1000}); !errors.Is(err, leasecore.ErrOutcomeUnknown) {
		t.Fatalf("Reserve with a failing journal: %v, want ErrOutcomeUnknown", err)
	}
	var pe *leasecore.PersistError
	if _, err := s.Live(ctx, "a"); !errors.As(err, &pe) {
		t.Fatalf("Live(a) while the journal cannot be checkpointed: %v, want a *PersistError", err)
	}
	repair()
	// Within a second of the failed retry, reads still fail at once.
	if _, err := s.Live(ctx, "a"); !errors.As(err, &pe) {
		t.Fatalf("Live(a) within the retry interval: %v, want a *PersistError", err)
	}
	clock.Advance(recheckpointEvery)
	if l, err := s.Live(ctx, "a"); err != nil || l.ID != g.Lease.ID {
		t.Fatalf("Live(a) after the disk recovered: %+v, %v; want lease %s", l, err, g.Lease.ID)
	}
	if _, err := s.Renew(ctx, g.Lease.ID, g.Token, nil); err != nil {
		t.Fatalf("Renew after the disk recovered: %v", err)
	}
	if s.jnl().broken() != nil {
		t.Errorf("the journal is still broken after a successful read: %v", s.jnl().broken())
	}
}

// Across many rotations of the journal files, with background checkpoints,
// a crash loses nothing acknowledged: the records not yet synced by a
// finished checkpoint are lost from the crash image, and the journals
// bring them back.
func TestJournalRotationsKeepEveryChange(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{Options: leasecore.Options{HistoryKeep: 5}})
	s.seam.Lock()
	s.checkpointAt = 2 << 10 // a rotation every few changes
	s.seam.Unlock()
	ctx := context.Background()
	var grants []leasecore.Grant
	for i := range 40 {
		g := reserve(t, s, "r"+strconv.Itoa(i))
		grants = append(grants, g)
		clock.Advance(1e9)
		if i%3 == 0 {
			if _, err := s.Renew(ctx, g.Lease.ID, g.Token, nil); err != nil {
				t.Fatal(err)
			}
		}
		if i%2 == 0 {
			if _, err := s.Release(ctx, g.Lease.ID, g.Token, leasecore.StatusComplete, nil); err != nil {
				t.Fatal(err)
			}
		}
		if i%10 == 9 {
			reap(t, s) // prunes history beyond 5
		}
	}
	if n := s.jnl().epoch; n < 6 {
		t.Fatalf("the journal reached epoch %d only; the test wants rotations", n)
	}
	want, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantHist, err := s.History(ctx, "")
	if err != nil {
		t.Fatal(err)
	}

	// The crash image: records the store has not synced are lost.
	s.seam.Lock()
	unsynced := maps.Clone(s.dirty)
	if c := s.ckpt; c != nil {
		select {
		case <-c.done:
			if c.err != nil {
				t.Errorf("background checkpoint: %v", c.err)
			}
		default:
			for _, id := range c.ids {
				unsynced[id] = struct{}{}
			}
		}
	}
	img := crashImage(t, state)
	s.seam.Unlock()
	for id := range unsynced {
		_ = os.Remove(filepath.Join(img, LeasesDir, id+".toml"))
	}
	if len(unsynced) == 0 {
		t.Fatal("no unsynced record to lose")
	}

	rw := openStore(t, img, Options{Options: leasecore.Options{Clock: clock, HistoryKeep: 5}})
	got, err := rw.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ids(got) != ids(want) {
		t.Errorf("live leases after the crash:\n%s\nwant:\n%s", ids(got), ids(want))
	}
	gotHist, err := rw.History(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if ids(gotHist) != ids(wantHist) {
		t.Errorf("history after the crash:\n%s\nwant:\n%s", ids(gotHist), ids(wantHist))
	}
	if g := reserve(t, rw, "next"); g.Lease.Generation <= grants[len(grants)-1].Lease.Generation {
		t.Errorf("generation after the crash = %d, want above %d", g.Lease.Generation, grants[len(grants)-1].Lease.Generation)
	}
}

// ids lists the ids, statuses and heartbeats of leases, sorted, one per line.
func ids(ls []leasecore.Lease) string {
	var out []string
	for _, l := range ls {
		out = append(out, l.ID+" "+string(l.Status)+" "+l.HeartbeatAt.Format(time.RFC3339Nano))
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// A journal replaced by a FIFO does not block "leasefs ls" (a read-only
// store warns and reads the records) and is refused by the daemon's store;
// a huge sparse journal is read only up to its bound.
func TestJournalHostileFiles(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	g := reserve(t, s, "x")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	j0 := filepath.Join(state, journalName0)
	if err := os.Remove(j0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(j0, 0o600); err != nil {
		t.Fatal(err)
	}
	ro := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, ReadOnly: true}, NoDaemon: true})
	if l, err := ro.Live(context.Background(), "x"); err != nil || l.ID != g.Lease.ID {
		t.Errorf("read-only store with a FIFO journal: Live = %+v, %v", l, err)
	}
	if _, err := Open(state, Options{Options: leasecore.Options{Clock: clock, Logger: quietLogger, Host: "testhost"}}); err == nil {
		t.Error("a writable store opened a FIFO as its journal")
	}
	if err := os.Remove(j0); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(j0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(8 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	rw := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
	if l, err := rw.Live(context.Background(), "x"); err != nil || l.ID != g.Lease.ID {
		t.Errorf("store with an 8 GiB sparse journal: Live = %+v, %v", l, err)
	}
}

// A FIFO in the place of a small state file (namespaces, generation, lease
// duration, waiters, the store lock) blocks neither a read-only store
// ("leasefs ls") nor a writable one: each opens at once, reading past the
// file or refusing it, and a lease recorded before is still there (or the
// open fails with an error).
func TestStateFilesFIFO(t *testing.T) {
	t.Parallel()
	for _, name := range []string{namespacesName, generationName, durationName, waitersName, filepath.Join("writer-leases", storeLockName)} {
		t.Run(strings.ReplaceAll(name, "/", "_"), func(t *testing.T) {
			t.Parallel()
			s, clock, state := newTestStore(t, Options{})
			g := reserve(t, s, "x")
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(state, name)
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
			if err := unix.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
			for _, opts := range []Options{
				{Options: leasecore.Options{Clock: clock, Logger: quietLogger, Host: "testhost", ReadOnly: true}, NoDaemon: true},
				{Options: leasecore.Options{Clock: clock, Logger: quietLogger, Host: "testhost"}},
			} {
				done := make(chan struct{})
				go func() {
					defer close(done)
					st, err := Open(state, opts)
					if err != nil {
						return // refused: fine, as long as it does not hang
					}
					defer st.Close()
					if l, err := st.Live(context.Background(), "x"); err != nil || l.ID != g.Lease.ID {
						t.Errorf("read-only %v, %s a FIFO: Live(x) = %+v, %v", opts.ReadOnly, name, l, err)
					}
				}()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Fatalf("read-only %v: opening a store whose %s is a FIFO hangs", opts.ReadOnly, name)
				}
			}
		})
	}
}

// Clean restarts never report a torn tail: each start and stop begins new
// epochs in the reused journal files, over the bytes of older ones, and
// however old those are, the end mark after the last entry tells them
// from a tear.
func TestJournalCleanRestartsReportNoTear(t *testing.T) {
	t.Parallel()
	clock := clocktest.NewFakeClock(testStart)
	state := t.TempDir()
	for i := range 12 {
		var log syncbuf.Buffer
		s := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, Logger: slog.New(slog.NewTextHandler(&log, nil))}})
		// Changes in the first run only: every later start finds that
		// run's entries, ever older, after its own header.
		if i == 0 {
			for k := range 5 {
				reserve(t, s, fmt.Sprintf("r%d", k))
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(log.String(), "torn tail") {
			t.Fatalf("start %d after a clean stop reported a torn tail:\n%s", i, log.String())
		}
	}
}
