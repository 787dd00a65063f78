package filestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/leasefs/leasefs/internal/engine"
	"github.com/leasefs/leasefs/leasecore"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// testStart is the wall time at which the fake clocks of these tests start.
// The forms of a lease id and a token, as NewLeaseID and NewToken make them.
var (
	leaseIDPattern = regexp.MustCompile(`^lease-[a-z2-7]{39}$`)
	tokenPattern   = regexp.MustCompile(`^hwl_[a-z2-7]{39}$`)
)

var testStart = time.Date(2026, 11, 30, 2, 0, 0, 123456789, time.UTC)

// quietLogger discards the store's log lines.
var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// openStore opens the file store in state, filling in a quiet logger and a
// host, and closes it when the test ends. opts.Clock must be set.
func openStore(t testing.TB, state string, opts Options) *Store {
	t.Helper()
	if opts.Clock == nil {
		t.Fatal("openStore: no clock")
	}
	if opts.Logger == nil {
		opts.Logger = quietLogger
	}
	if opts.Host == "" {
		opts.Host = "testhost"
	}
	s, err := Open(state, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", state, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newStore opens a fresh store in its own temporary state directory with a
// fake clock at testStart.
func newTestStore(t *testing.T, opts Options) (*Store, *clocktest.FakeClock, string) {
	t.Helper()
	clock := clocktest.NewFakeClock(testStart)
	opts.Clock = clock
	state := t.TempDir()
	return openStore(t, state, opts), clock, state
}

// reserve reserves resource for uid 1000 and fails the test on error.
func reserve(t testing.TB, s leasecore.Store, resource string) leasecore.Grant {
	t.Helper()
	g, err := s.Reserve(context.Background(), leasecore.Draft{Resource: resource, HolderUID: 1000, HolderGID: 100, HolderPID: 4242})
	if err != nil {
		t.Fatalf("Reserve(%q): %v", resource, err)
	}
	return g
}

// recordPath is the record file of lease id in state.
// reap runs the store's reaper once, as its goroutine would.
func reap(t testing.TB, s interface {
	Reap(context.Context) ([]leasecore.Lease, error)
}) []leasecore.Lease {
	t.Helper()
	ended, err := s.Reap(context.Background())
	if err != nil {
		t.Fatalf("Reap: %v", err)
	}
	return ended
}

func recordPath(state, id string) string {
	return filepath.Join(state, LeasesDir, id+".toml")
}

func readFile(t testing.TB, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// mkdir creates namespace path and fails the test on error.
func mkdir(t *testing.T, s leasecore.Store, path string) {
	t.Helper()
	if _, err := s.Mkdir(context.Background(), path, 0, 0); err != nil {
		t.Fatalf("Mkdir(%q): %v", path, err)
	}
}

// wantErr fails the test unless errors.Is(err, want).
func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: error = %v, want %v", what, err, want)
	}
}

func TestReserveGrant(t *testing.T) {
	t.Parallel()
	s, _, state := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "feature-a")
	l := g.Lease
	if !leaseIDPattern.MatchString(l.ID) || !tokenPattern.MatchString(g.Token) {
		t.Fatalf("grant id %q token %q have the wrong form", l.ID, g.Token)
	}
	if l.Resource != "feature-a" || l.Status != leasecore.StatusActive || l.Mode != leasecore.ModeToken ||
		l.HolderUID != 1000 || l.HolderGID != 100 || l.HolderPID != 4242 || l.Host != "testhost" {
		t.Errorf("grant lease = %+v", l)
	}
	if !l.StartedAt.Equal(testStart) || !l.HeartbeatAt.Equal(testStart) ||
		!l.ExpiresAt.Equal(testStart.Add(leasecore.DefaultLeaseDuration)) || !l.CompletedAt.IsZero() {
		t.Errorf("times: started %v heartbeat %v expires %v completed %v", l.StartedAt, l.HeartbeatAt, l.ExpiresAt, l.CompletedAt)
	}
	if l.BootID != procfs.BootID() {
		t.Errorf("BootID = %q, want %q", l.BootID, procfs.BootID())
	}
	got, err := s.Live(ctx, "feature-a")
	if err != nil || got.ID != l.ID || got.Generation != l.Generation {
		t.Fatalf("Live = %+v, %v; want lease %s", got, err, l.ID)
	}
	flushRecords(t, s)
	if _, err := os.Stat(recordPath(state, l.ID)); err != nil {
		t.Fatalf("record not written: %v", err)
	}
}

// The reference store's test token_is_required_to_renew_or_release.
func TestTokenRequiredToRenewAndRelease(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	mkdir(t, s, "feature")
	ctx := context.Background()
	g := reserve(t, s, "feature/a")
	flushRecords(t, s)
	path := recordPath(state, g.Lease.ID)
	before := readFile(t, path)
	clock.Advance(time.Minute)

	_, err := s.Renew(ctx, g.Lease.ID, "hwl_wrong", leasecore.Annotations{})
	wantErr(t, "Renew with a wrong token", err, leasecore.ErrTokenMismatch)
	_, err = s.Release(ctx, g.Lease.ID, leasecore.NewToken(), leasecore.StatusComplete, nil)
	wantErr(t, "Release with a wrong token", err, leasecore.ErrTokenMismatch)
	flushRecords(t, s)
	if after := readFile(t, path); !bytes.Equal(before, after) {
		t.Fatalf("a refused token changed the record:\n%s\n---\n%s", before, after)
	}
	l, err := s.Live(ctx, "feature/a")
	if err != nil || !l.HeartbeatAt.Equal(testStart) || l.Status != leasecore.StatusActive {
		t.Fatalf("after refused renew: Live = %+v, %v", l, err)
	}

	l, err = s.Renew(ctx, g.Lease.ID, g.Token, leasecore.Annotations{})
	if err != nil {
		t.Fatalf("Renew with the token: %v", err)
	}
	if want := testStart.Add(time.Minute); !l.HeartbeatAt.Equal(want) || !l.ExpiresAt.Equal(want.Add(leasecore.DefaultLeaseDuration)) {
		t.Errorf("renewed heartbeat %v expires %v, want %v", l.HeartbeatAt, l.ExpiresAt, want)
	}

	l, err = s.Release(ctx, g.Lease.ID, g.Token, leasecore.StatusComplete, nil)
	if err != nil {
		t.Fatalf("Release with the token: %v", err)
	}
	if l.Status != leasecore.StatusComplete || !l.CompletedAt.Equal(testStart.Add(time.Minute)) || !l.ExpiresAt.IsZero() {
		t.Errorf("released lease = %+v", l)
	}
	_, err = s.Live(ctx, "feature/a")
	wantErr(t, "Live after release", err, leasecore.ErrNotFound)
	reserve(t, s, "feature/a") // the name is free at once
}

// The reference store's test expired_lease_does_not_block_a_new_owner.
func TestExpiredLeaseDoesNotBlockNewOwner(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	mkdir(t, s, "feature")
	ctx := context.Background()
	first := reserve(t, s, "feature/a")

	clock.Advance(leasecore.DefaultLeaseDuration - time.Second)
	_, err := s.Reserve(ctx, leasecore.Draft{Resource: "feature/a"})
	wantErr(t, "Reserve before expiry", err, leasecore.ErrHeld)

	clock.Advance(2 * time.Second)
	second := reserve(t, s, "feature/a")
	if second.Lease.ID == first.Lease.ID || second.Lease.Generation <= first.Lease.Generation {
		t.Fatalf("second lease %s gen %d, first %s gen %d", second.Lease.ID, second.Lease.Generation, first.Lease.ID, first.Lease.Generation)
	}
	old, err := s.Load(ctx, first.Lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	if old.Status != leasecore.StatusAbandoned || !old.CompletedAt.Equal(clock.Now()) {
		t.Errorf("expired lease: status %s completed_at %v, want abandoned at %v", old.Status, old.CompletedAt, clock.Now())
	}
	flushRecords(t, s)
	rec := readRecordMap(t, recordPath(state, first.Lease.ID))
	if rec["status"] != "abandoned" || rec["completed_at"] == nil {
		t.Errorf("expired record on disk: status %v completed_at %v", rec["status"], rec["completed_at"])
	}
	_, err = s.Renew(ctx, first.Lease.ID, first.Token, leasecore.Annotations{})
	wantErr(t, "Renew of the expired lease", err, leasecore.ErrInactive)
}

// The reference store's test stored_lease_does_not_contain_bearer_token.
func TestStoredRecordHasNoToken(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	mkdir(t, s, "feature")
	ctx := context.Background()
	g := reserve(t, s, "feature/a")
	path := recordPath(state, g.Lease.ID)
	check := func(when string) {
		t.Helper()
		flushRecords(t, s)
		data := string(readFile(t, path))
		if strings.Contains(data, g.Token) || strings.Contains(data, strings.TrimPrefix(g.Token, leasecore.TokenPrefix)) {
			t.Fatalf("%s: record contains the token:\n%s", when, data)
		}
		if !strings.Contains(data, "token_hash") || !strings.Contains(data, leasecore.HashToken(g.Token)) {
			t.Fatalf("%s: record lacks token_hash = %s:\n%s", when, leasecore.HashToken(g.Token), data)
		}
	}
	check("after reserve")
	clock.Advance(time.Second)
	if _, err := s.Renew(ctx, g.Lease.ID, g.Token, leasecore.Annotations{}); err != nil {
		t.Fatal(err)
	}
	check("after renew")
	if _, err := s.Release(ctx, g.Lease.ID, g.Token, leasecore.StatusAbandoned, nil); err != nil {
		t.Fatal(err)
	}
	check("after release")
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("record mode = %v (%v), want 0600", fi.Mode(), err)
	}
	fi, err = os.Stat(filepath.Join(state, LeasesDir))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("leases dir mode = %v (%v), want 0700", fi.Mode(), err)
	}
}

func TestReserveHeldNamesHolder(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t, Options{})
	mkdir(t, s, "feature")
	first := reserve(t, s, "feature/a")
	_, err := s.Reserve(context.Background(), leasecore.Draft{Resource: "feature/a", HolderUID: 2000})
	wantErr(t, "second Reserve", err, leasecore.ErrHeld)
	var held *leasecore.LeaseHeldError
	if !errors.As(err, &held) {
		t.Fatalf("error %T is not a *LeaseHeldError", err)
	}
	if held.Holder.ID != first.Lease.ID || held.Holder.HolderUID != 1000 || held.Holder.Generation != first.Lease.Generation {
		t.Errorf("holder = %+v, want lease %s of uid 1000", held.Holder, first.Lease.ID)
	}
	if msg := err.Error(); !strings.Contains(msg, first.Lease.ID) || !strings.Contains(msg, "feature/a") || strings.Contains(msg, first.Token) {
		t.Errorf("error message %q", msg)
	}
}

func TestOperationsOnUnknownEndedAndInvalidLeases(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t, Options{})
	ctx := context.Background()
	ended := reserve(t, s, "ended")
	if _, err := s.End(ctx, ended.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	unknown := leasecore.NewLeaseID()
	ops := map[string]func(id, token string) error{
		"Renew": func(id, tok string) error { _, err := s.Renew(ctx, id, tok, leasecore.Annotations{}); return err },
		"Release": func(id, tok string) error {
			_, err := s.Release(ctx, id, tok, leasecore.StatusComplete, nil)
			return err
		},
		"End": func(id, _ string) error { _, err := s.End(ctx, id, leasecore.StatusComplete); return err },
		"RequestTakeover": func(id, _ string) error {
			_, err := s.RequestTakeover(ctx, id, leasecore.TakeoverRequest{By: "uid 2"})
			return err
		},
	}
	for name, op := range ops {
		wantErr(t, name+" of an unknown lease", op(unknown, ended.Token), leasecore.ErrNotFound)
		wantErr(t, name+" of an ended lease", op(ended.Lease.ID, ended.Token), leasecore.ErrInactive)
		wantErr(t, name+" of an invalid id", op("../x", ended.Token), leasecore.ErrInvalidID)
	}
	_, err := s.Load(ctx, unknown)
	wantErr(t, "Load of an unknown lease", err, leasecore.ErrNotFound)
	_, err = s.Load(ctx, "lease-../../etc/passwd")
	wantErr(t, "Load of an invalid id", err, leasecore.ErrInvalidID)
	l, err := s.Load(ctx, ended.Lease.ID)
	if err != nil || l.Status != leasecore.StatusComplete {
		t.Errorf("Load of the ended lease = %+v, %v", l, err)
	}
}

func TestEndAndEndStatus(t *testing.T) {
	t.Parallel()
	s, clock, _ := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "x")
	for _, bad := range []leasecore.Status{leasecore.StatusActive, "", "weird"} {
		_, err := s.End(ctx, g.Lease.ID, bad)
		wantErr(t, "End with status "+string(bad), err, leasecore.ErrInvalidArgument)
		_, err = s.Release(ctx, g.Lease.ID, g.Token, bad, nil)
		wantErr(t, "Release with status "+string(bad), err, leasecore.ErrInvalidArgument)
	}
	if _, err := s.Live(ctx, "x"); err != nil {
		t.Fatalf("refused End changed the lease: %v", err)
	}
	clock.Advance(time.Second)
	l, err := s.End(ctx, g.Lease.ID, leasecore.StatusAbandoned)
	if err != nil || l.Status != leasecore.StatusAbandoned || !l.CompletedAt.Equal(clock.Now()) {
		t.Fatalf("End = %+v, %v", l, err)
	}
	_, err = s.Live(ctx, "x")
	wantErr(t, "Live after End", err, leasecore.ErrNotFound)
}

func TestRequestTakeover(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "x")
	clock.Advance(time.Minute)
	_, err := s.RequestTakeover(ctx, g.Lease.ID, leasecore.TakeoverRequest{By: "uid 2", Reason: strings.Repeat("r", 1025)})
	wantErr(t, "oversized reason", err, leasecore.ErrInvalidArgument)
	_, err = s.RequestTakeover(ctx, g.Lease.ID, leasecore.TakeoverRequest{By: "uid\x00 2"})
	wantErr(t, "NUL in By", err, leasecore.ErrInvalidArgument)

	l, err := s.RequestTakeover(ctx, g.Lease.ID, leasecore.TakeoverRequest{By: "uid 2000 pid 7", Reason: "need it"})
	if err != nil {
		t.Fatal(err)
	}
	check := func(l leasecore.Lease) {
		t.Helper()
		if l.TakeoverRequestedBy != "uid 2000 pid 7" || l.TakeoverReason != "need it" || !l.TakeoverRequestedAt.Equal(clock.Now()) {
			t.Errorf("takeover fields = %q %q %v", l.TakeoverRequestedBy, l.TakeoverReason, l.TakeoverRequestedAt)
		}
		if l.Status != leasecore.StatusActive || !l.HeartbeatAt.Equal(testStart) {
			t.Errorf("takeover changed the lease: status %s heartbeat %v", l.Status, l.HeartbeatAt)
		}
	}
	check(l)
	live, err := s.Live(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	check(live)
	s.Close()
	s2 := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
	live, err = s2.Live(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	check(live)
}

func TestListAndHistory(t *testing.T) {
	t.Parallel()
	s, clock, _ := newTestStore(t, Options{})
	ctx := context.Background()
	for _, r := range []string{"c", "a", "b"} {
		reserve(t, s, r)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 3 || list[0].Resource != "a" || list[1].Resource != "b" || list[2].Resource != "c" {
		t.Fatalf("List = %+v, %v", list, err)
	}
	var ids []string
	for _, l := range list {
		clock.Advance(time.Second)
		if _, err := s.End(ctx, l.ID, leasecore.StatusComplete); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, l.ID)
	}
	hist, err := s.History(ctx, "")
	if err != nil || len(hist) != 3 {
		t.Fatalf("History = %+v, %v", hist, err)
	}
	for i, l := range hist { // newest first
		if l.ID != ids[len(ids)-1-i] {
			t.Errorf("History[%d] = %s, want %s", i, l.ID, ids[len(ids)-1-i])
		}
	}
	hist, err = s.History(ctx, "b")
	if err != nil || len(hist) != 1 || hist[0].Resource != "b" {
		t.Fatalf("History(b) = %+v, %v", hist, err)
	}
	if list, _ := s.List(ctx); len(list) != 0 {
		t.Fatalf("List after ending all = %+v", list)
	}
}

func TestReapEndsExpiredLeases(t *testing.T) {
	t.Parallel()
	s, clock, _ := newTestStore(t, Options{Options: leasecore.Options{LeaseDuration: time.Minute}})
	ctx := context.Background()
	old := reserve(t, s, "old")
	clock.Advance(30 * time.Second)
	fresh := reserve(t, s, "fresh")
	clock.Advance(31 * time.Second)
	ended, err := s.Reap(ctx)
	if err != nil || len(ended) != 1 || ended[0].ID != old.Lease.ID || ended[0].Status != leasecore.StatusAbandoned {
		t.Fatalf("Reap = %+v, %v; want only %s", ended, err, old.Lease.ID)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != fresh.Lease.ID {
		t.Fatalf("List after reap = %+v, %v", list, err)
	}
}

// pruneSpy is a persister that records how many records each
// RemoveRecords call removes and, at the first, starts a goroutine that
// takes the engine's lock, noting how many calls had run once it had it.
type pruneSpy struct {
	engine.Persister
	seam    func() engine.Seam
	calls   []int
	gotMuAt chan int
}

func (p *pruneSpy) RemoveRecords(ids []string) error {
	p.calls = append(p.calls, len(ids))
	if len(p.calls) == 1 {
		go func() {
			p.seam().Lock()
			n := len(p.calls)
			p.seam().Unlock()
			p.gotMuAt <- n
		}()
	}
	return p.Persister.RemoveRecords(ids)
}

// TestPruneLetsTheMutexGoBetweenChunks: a prune of many records removes
// them engine.PruneChunk at a time and lets the store's mutex go between chunks,
// so that a change waits for one chunk, not for the whole prune; every
// record beyond HistoryKeep is gone once Reap returns, the newest kept.
func TestPruneLetsTheMutexGoBetweenChunks(t *testing.T) {
	t.Parallel()
	const keep, ended = 10, 330 // pruning removes 10 chunks and more
	clock := clocktest.NewFakeClock(testStart)
	state := t.TempDir()
	var spy *pruneSpy
	var s *Store
	s, err := open(state, Options{Options: leasecore.Options{HistoryKeep: keep, ReapInterval: time.Hour, Clock: clock, Logger: quietLogger, Host: "testhost"}},
		func(p engine.Persister) engine.Persister {
			spy = &pruneSpy{Persister: p, seam: func() engine.Seam { return s.seam }, gotMuAt: make(chan int, 1)}
			return spy
		})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	var newest []string
	for i := range ended {
		g := reserve(t, s, fmt.Sprintf("r%d", i))
		clock.Advance(time.Millisecond)
		if _, err := s.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
			t.Fatal(err)
		}
		if i >= ended-keep {
			newest = append(newest, g.Lease.ID)
		}
	}
	s.seam.Lock()
	spy.calls = nil // prunes only: none ran before this reap
	s.seam.Unlock()
	reap(t, s)
	s.seam.Lock()
	calls := slices.Clone(spy.calls)
	s.seam.Unlock()

	removed := 0
	for _, n := range calls {
		if n > engine.PruneChunk {
			t.Errorf("one hold of the mutex removed %d records, want at most %d", n, engine.PruneChunk)
		}
		removed += n
	}
	if removed != ended-keep {
		t.Errorf("removed %d records in %d calls, want %d", removed, len(calls), ended-keep)
	}
	if n := <-spy.gotMuAt; n >= len(calls) {
		t.Errorf("another caller got the mutex only after the last of %d chunks", len(calls))
	}
	hist, err := s.History(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range hist {
		got = append(got, l.ID)
	}
	slices.Sort(got)
	slices.Sort(newest)
	if !slices.Equal(got, newest) {
		t.Errorf("history after the prune: %d records, want the newest %d", len(got), keep)
	}
	if err := s.Close(); err != nil { // writes the records written behind
		t.Fatal(err)
	}
	names, err := os.ReadDir(filepath.Join(state, "writer-leases"))
	if err != nil {
		t.Fatal(err)
	}
	records := 0
	for _, e := range names {
		if strings.HasSuffix(e.Name(), ".toml") {
			records++
		}
	}
	if records != keep {
		t.Errorf("%d record files after the prune, want %d", records, keep)
	}
}
