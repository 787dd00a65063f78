package filestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/leasefs/leasefs/leasecore"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// recordFiles counts the lease records in state.
func recordFiles(t *testing.T, state string) int {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(state, LeasesDir, "lease-*.toml"))
	if err != nil {
		t.Fatal(err)
	}
	return len(names)
}

func TestGenerationIncreasesAcrossReserves(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()
	var last uint64
	for i := range 5 {
		g := reserve(t, s, fmt.Sprintf("r%d", i%2))
		if g.Lease.Generation <= last {
			t.Fatalf("generation %d after %d", g.Lease.Generation, last)
		}
		last = g.Lease.Generation
		if _, err := s.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s2 := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
	g := reserve(t, s2, "r0")
	if g.Lease.Generation <= last {
		t.Fatalf("after reopen generation %d, want > %d", g.Lease.Generation, last)
	}
}

func TestGenerationSurvivesPruning(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// reverse ends the leases newest generation first.
		reverse bool
	}{
		{name: "oldest ended first"},
		// The newest generation ends first, so pruning deletes its record
		// and only the generation mark can remember it.
		{name: "newest ended first", reverse: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, clock, state := newTestStore(t, Options{Options: leasecore.Options{HistoryKeep: 2}})
			ctx := context.Background()
			var grants []leasecore.Grant
			for i := range 10 {
				grants = append(grants, reserve(t, s, fmt.Sprintf("r%d", i)))
			}
			maxGen := grants[len(grants)-1].Lease.Generation
			for i := range grants {
				g := grants[i]
				if tc.reverse {
					g = grants[len(grants)-1-i]
				}
				clock.Advance(time.Second)
				if _, err := s.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Reap(ctx); err != nil {
				t.Fatalf("Reap: %v", err)
			}
			flushRecords(t, s)
			if n := recordFiles(t, state); n != 2 {
				t.Fatalf("%d records after pruning, want 2", n)
			}
			hist, err := s.History(ctx, "")
			if err != nil || len(hist) != 2 {
				t.Fatalf("History = %d leases, %v; want 2", len(hist), err)
			}
			s.Close()

			// Only ended records remain, none of them (in the reverse case)
			// with the highest generation granted.
			s2 := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, HistoryKeep: 2}})
			g := reserve(t, s2, "r0")
			if g.Lease.Generation <= maxGen {
				t.Fatalf("generation %d after pruning and reopen, want > %d", g.Lease.Generation, maxGen)
			}
			if g2 := reserve(t, s2, "r1"); g2.Lease.Generation <= g.Lease.Generation {
				t.Fatalf("generation %d after %d", g2.Lease.Generation, g.Lease.Generation)
			}
		})
	}
}

func TestRestartKeepsTokenLeaseWithoutExtending(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "feature-a")
	clock.Advance(2 * time.Minute)
	s.Close()

	clock2 := clocktest.NewFakeClock(clock.Now()) // same wall time, new monotonic origin
	s2 := openStore(t, state, Options{Options: leasecore.Options{Clock: clock2}})
	l, err := s2.Live(ctx, "feature-a")
	if err != nil {
		t.Fatalf("Live after restart: %v", err)
	}
	if l.ID != g.Lease.ID || !l.HeartbeatAt.Equal(g.Lease.HeartbeatAt) || !l.ExpiresAt.Equal(g.Lease.ExpiresAt) ||
		l.Generation != g.Lease.Generation {
		t.Fatalf("after restart: %s heartbeat %v expires %v gen %d; want %s %v %v %d", l.ID, l.HeartbeatAt, l.ExpiresAt,
			l.Generation, g.Lease.ID, g.Lease.HeartbeatAt, g.Lease.ExpiresAt, g.Lease.Generation)
	}
	clock2.Advance(3*time.Minute - time.Second)
	if _, err := s2.Live(ctx, "feature-a"); err != nil {
		t.Fatalf("Live 4m59s after the heartbeat: %v", err)
	}
	clock2.Advance(time.Second)
	_, err = s2.Live(ctx, "feature-a")
	wantErr(t, "Live 5m after the heartbeat", err, leasecore.ErrNotFound)
	if _, err := s2.Renew(ctx, g.Lease.ID, g.Token, leasecore.Annotations{}); !errors.Is(err, leasecore.ErrInactive) {
		t.Fatalf("Renew of the lease that expired across a restart = %v, want ErrInactive", err)
	}
}

func TestWallClockStepsNeitherExpireNorExtend(t *testing.T) {
	t.Parallel()
	for _, step := range []time.Duration{time.Hour, -time.Hour, 24 * time.Hour, -10 * time.Minute} {
		t.Run(step.String(), func(t *testing.T) {
			t.Parallel()
			s, clock, _ := newTestStore(t, Options{})
			ctx := context.Background()
			reserve(t, s, "x")
			clock.Advance(time.Minute)
			clock.StepWall(step)
			if _, err := s.Live(ctx, "x"); err != nil {
				t.Fatalf("Live right after a wall step of %v: %v", step, err)
			}
			if _, err := s.Reserve(ctx, leasecore.Draft{Resource: "x"}); !errors.Is(err, leasecore.ErrHeld) {
				t.Fatalf("Reserve after a wall step of %v = %v, want ErrHeld", step, err)
			}
			clock.Advance(leasecore.DefaultLeaseDuration - time.Minute - time.Second)
			if _, err := s.Live(ctx, "x"); err != nil {
				t.Fatalf("Live 4m59s after reserve with a wall step of %v: %v", step, err)
			}
			clock.Advance(time.Second)
			_, err := s.Live(ctx, "x")
			wantErr(t, "Live 5m after reserve", err, leasecore.ErrNotFound)
		})
	}
}

func TestHandleLeasesEndedAtOpen(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()
	h, err := s.Reserve(ctx, leasecore.Draft{Resource: "session-1", Mode: leasecore.ModeHandle, HolderUID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if !h.Lease.ExpiresAt.IsZero() {
		t.Errorf("handle lease has ExpiresAt %v", h.Lease.ExpiresAt)
	}
	tok := reserve(t, s, "token-1")
	s.Close()
	path := recordPath(state, h.Lease.ID)
	rec := readRecordMap(t, path)
	if rec["mode"] != "handle" || rec["status"] != "active" {
		t.Fatalf("handle record: mode %v status %v", rec["mode"], rec["status"])
	}
	before := readFile(t, path)

	ro := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, ReadOnly: true}})
	if _, err := ro.List(ctx); err != nil {
		t.Fatal(err)
	}
	ro.Close()
	if after := readFile(t, path); !bytes.Equal(before, after) {
		t.Fatalf("a read-only open rewrote the handle record:\n%s", after)
	}

	clock.Advance(time.Second)
	s2 := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
	_, err = s2.Live(ctx, "session-1")
	wantErr(t, "Live of a handle lease of a previous daemon", err, leasecore.ErrNotFound)
	l, err := s2.Load(ctx, h.Lease.ID)
	if err != nil || l.Status != leasecore.StatusAbandoned || !l.CompletedAt.Equal(clock.Now()) {
		t.Fatalf("handle lease after reopen = %+v, %v", l, err)
	}
	if rec := readRecordMap(t, path); rec["status"] != "abandoned" || rec["completed_at"] == nil {
		t.Errorf("handle record after reopen: %v", rec)
	}
	if _, err := s2.Live(ctx, "token-1"); err != nil {
		t.Errorf("token lease %s did not survive the reopen: %v", tok.Lease.ID, err)
	}
	reserve(t, s2, "session-1")
}

func TestReadOnlyStore(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "x")
	reserve(t, s, "y")
	if _, err := s.Mkdir(ctx, "ns", 0, 0); err != nil {
		t.Fatal(err)
	}
	clock.Advance(3 * time.Minute)
	if _, err := s.Renew(ctx, g.Lease.ID, g.Token, leasecore.Annotations{}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	clock.Advance(3 * time.Minute) // y is now dead, x live

	snapshot := func() map[string][]byte {
		t.Helper()
		out := make(map[string][]byte)
		filepath.WalkDir(state, func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				out[path] = readFile(t, path)
			}
			return err
		})
		return out
	}
	before := snapshot()
	ro := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, ReadOnly: true}})
	list, err := ro.List(ctx)
	if err != nil || len(list) != 1 || list[0].Resource != "x" {
		t.Fatalf("read-only List = %+v, %v; want only x", list, err)
	}
	if _, err := ro.Live(ctx, "y"); !errors.Is(err, leasecore.ErrNotFound) {
		t.Errorf("read-only Live of a dead lease = %v, want ErrNotFound", err)
	}
	if _, err := ro.Namespace(ctx, "ns"); err != nil {
		t.Errorf("read-only Namespace: %v", err)
	}
	mutations := map[string]error{}
	_, mutations["Reserve"] = ro.Reserve(ctx, leasecore.Draft{Resource: "z"})
	_, mutations["Renew"] = ro.Renew(ctx, g.Lease.ID, g.Token, leasecore.Annotations{})
	_, mutations["Release"] = ro.Release(ctx, g.Lease.ID, g.Token, leasecore.StatusComplete, nil)
	_, mutations["End"] = ro.End(ctx, g.Lease.ID, leasecore.StatusComplete)
	_, mutations["RequestTakeover"] = ro.RequestTakeover(ctx, g.Lease.ID, leasecore.TakeoverRequest{By: "me"})
	_, mutations["Acquire"] = ro.Acquire(ctx, leasecore.Draft{Resource: "z"})
	_, mutations["Bind"] = ro.Bind(ctx, g.Lease.ID, 1)
	_, mutations["Mkdir"] = ro.Mkdir(ctx, "ns2", 0, 0)
	mutations["Rmdir"] = ro.Rmdir(ctx, "ns")
	_, mutations["Reap"] = ro.Reap(ctx)
	for name, err := range mutations {
		wantErr(t, "read-only "+name, err, leasecore.ErrReadOnly)
	}
	ro.Close()
	after := snapshot()
	if len(after) != len(before) {
		t.Fatalf("read-only store changed the file set: %d files before, %d after", len(before), len(after))
	}
	for path, data := range before {
		if !bytes.Equal(data, after[path]) {
			t.Errorf("read-only store changed %s", path)
		}
	}

	// A state directory that was never served is an empty store, and
	// reading it creates nothing.
	missing := filepath.Join(t.TempDir(), "missing")
	empty, err := Open(missing, Options{Options: leasecore.Options{Clock: clock, ReadOnly: true, Logger: quietLogger}})
	if err != nil {
		t.Fatalf("read-only open of a missing state directory: %v", err)
	}
	if list, err := empty.List(ctx); err != nil || len(list) != 0 {
		t.Errorf("List of a missing state directory = %+v, %v; want none", list, err)
	}
	if hist, err := empty.History(ctx, ""); err != nil || len(hist) != 0 {
		t.Errorf("History of a missing state directory = %+v, %v; want none", hist, err)
	}
	empty.Close()
	if _, err := os.Lstat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("read-only open created %s (lstat: %v)", missing, err)
	}
}

func TestDuplicateActiveRecordsNewerWins(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	clock := clocktest.NewFakeClock(testStart)
	older := testRecord("dup", 3)
	newer := testRecord("dup", 5)
	writeRecordFile(t, state, older)
	writeRecordFile(t, state, newer)
	s := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
	ctx := context.Background()
	l, err := s.Live(ctx, "dup")
	if err != nil || l.ID != newer.ID {
		t.Fatalf("Live = %+v, %v; want %s", l, err, newer.ID)
	}
	o, err := s.Load(ctx, older.ID)
	if err != nil || o.Status != leasecore.StatusAbandoned {
		t.Fatalf("older duplicate = %+v, %v; want abandoned", o, err)
	}
	if g := reserve(t, s, "other"); g.Lease.Generation != 6 {
		t.Errorf("generation after records of 3 and 5 = %d, want 6", g.Lease.Generation)
	}
}

// A change that cannot be persisted is refused with a *PersistError and
// changes nothing, in memory or on disk — a renew too, although its record
// would be written behind: the store checks the records directory before
// it journals one. The leases directory is moved away (root ignores
// permission bits, so chmod cannot make it unwritable).
func TestPersistFailureChangesNothing(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "x")
	dir := filepath.Join(state, LeasesDir)
	moved := dir + ".moved"
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)

	checkPersist := func(what string, err error) {
		t.Helper()
		var pe *leasecore.PersistError
		if !errors.As(err, &pe) {
			t.Fatalf("%s with the leases directory gone: error %v (%T), want *PersistError", what, err, err)
		}
	}
	_, err := s.Reserve(ctx, leasecore.Draft{Resource: "y"})
	checkPersist("Reserve", err)
	_, err = s.Renew(ctx, g.Lease.ID, g.Token, leasecore.Annotations{})
	checkPersist("Renew", err)
	_, err = s.End(ctx, g.Lease.ID, leasecore.StatusComplete)
	checkPersist("End", err)
	_, err = s.RequestTakeover(ctx, g.Lease.ID, leasecore.TakeoverRequest{By: "me"})
	checkPersist("RequestTakeover", err)

	if err := os.Rename(moved, dir); err != nil {
		t.Fatal(err)
	}
	l, err := s.Live(ctx, "x")
	if err != nil || !l.HeartbeatAt.Equal(testStart) || l.TakeoverRequestedBy != "" {
		t.Fatalf("after failed changes: Live(x) = %+v, %v; want unchanged", l, err)
	}
	if _, err := s.Live(ctx, "y"); !errors.Is(err, leasecore.ErrNotFound) {
		t.Fatalf("failed Reserve left a lease on y: %v", err)
	}
	if g2 := reserve(t, s, "y"); g2.Lease.Generation != g.Lease.Generation+1 {
		t.Errorf("failed Reserve consumed a generation: got %d, want %d", g2.Lease.Generation, g.Lease.Generation+1)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if rec, _, err := leasecore.DecodeRecord(readFile(t, recordPath(state, g.Lease.ID))); err != nil || !rec.HeartbeatAt.Equal(testStart) || rec.TakeoverRequestedBy != "" {
		t.Errorf("record after Close: %+v, %v; want it unchanged", rec, err)
	}
}

// Ends that a restart would make anyway (a lease dead by the liveness
// rules) take effect in memory when the disk refuses the record, and the
// record is written by a later Reap once it can be. The end of a handle
// lease is not one of them: the next daemon keeps a handle lease whose open
// file lives, so its end fails and the lease stays live until the disk
// takes it.
func TestDeferrableEndsSurvivePersistFailure(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{Options: leasecore.Options{LeaseDuration: time.Minute}})
	ctx := context.Background()
	expiring := reserve(t, s, "expiring")
	handle, err := s.Reserve(ctx, leasecore.Draft{Resource: "handle", Mode: leasecore.ModeHandle, HolderUID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(state, LeasesDir)
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Minute)
	if _, err := s.End(ctx, handle.Lease.ID, leasecore.StatusComplete); err == nil {
		t.Fatal("End of a handle lease on a failing disk succeeded, want its error")
	}
	leases, err := s.List(ctx)
	if err != nil || len(leases) != 1 || leases[0].ID != handle.Lease.ID {
		t.Fatalf("List on a failing disk = %v, %v; want only the handle lease live", leases, err)
	}
	if err := os.Rename(dir+".moved", dir); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reap(ctx); err != nil {
		t.Fatalf("Reap once the disk works: %v", err)
	}
	if _, err := s.End(ctx, handle.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatalf("End of the handle lease once the disk works: %v", err)
	}
	flushRecords(t, s)
	for id, want := range map[string]string{expiring.Lease.ID: "abandoned", handle.Lease.ID: "complete"} {
		if data := string(readFile(t, recordPath(state, id))); !strings.Contains(data, `status = "`+want+`"`) {
			t.Errorf("record of %s after Reap:\n%s\nwant status %s", id, data, want)
		}
	}
}

// A read-only store does not hang behind a writer that never lets go of
// the store lock (a killed daemon stuck in the kernel keeps its locks): it
// reads without the lock after a bounded wait.
func TestReadOnlyOpenDoesNotHangOnAHeldLock(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	reserve(t, s, "x")
	f, err := os.Open(filepath.Join(state, LeasesDir, storeLockName))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	ro := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, ReadOnly: true}})
	if l, err := ro.Live(context.Background(), "x"); err != nil || l.Resource != "x" {
		t.Fatalf("read-only Live behind a held lock = %+v, %v", l, err)
	}
}

// TestAncientHeartbeatIsExpired: a record whose heartbeat is so old that
// the wall clock's difference saturates (year 1677) loads as expired, as
// one from 1900 does, rather than wrapping around to a lease that never
// expires.
func TestAncientHeartbeatIsExpired(t *testing.T) {
	t.Parallel()
	for _, year := range []int{1, 1677, 1900, 1970} {
		t.Run(strconv.Itoa(year), func(t *testing.T) {
			t.Parallel()
			s, clock, state := newTestStore(t, Options{})
			g := reserve(t, s, "old")
			s.Close()
			l := g.Lease
			l.HeartbeatAt = time.Date(year, 9, 22, 0, 0, 0, 0, time.UTC)
			l.StartedAt = l.HeartbeatAt
			if err := os.WriteFile(recordPath(state, l.ID), leasecore.EncodeRecord(&l, leasecore.HashToken(g.Token)), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for _, ro := range []bool{true, false} {
				s := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, ReadOnly: ro}})
				if _, err := s.Live(ctx, "old"); !errors.Is(err, leasecore.ErrNotFound) {
					t.Errorf("read-only %v: Live of a lease last heartbeat in %d = %v, want ErrNotFound", ro, year, err)
				}
				clock.Advance(time.Second)
				if _, err := s.Live(ctx, "old"); !errors.Is(err, leasecore.ErrNotFound) {
					t.Errorf("read-only %v, a second later: Live of a lease last heartbeat in %d = %v, want ErrNotFound", ro, year, err)
				}
				s.Close()
			}
		})
	}
}
