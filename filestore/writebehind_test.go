package filestore

import (
	"context"
	"errors"
	"github.com/leasefs/leasefs/leasecore"
	"io/fs"
	"os"
	"testing"
	"time"

	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// recordHeartbeat returns the heartbeat in the record file of lease id.
func recordHeartbeat(t *testing.T, state, id string) time.Time {
	t.Helper()
	l, _, err := leasecore.DecodeRecord(readFile(t, recordPath(state, id)))
	if err != nil {
		t.Fatal(err)
	}
	return l.HeartbeatAt
}

// A renew's record is written behind: with the flusher stopped, the file
// keeps the old heartbeat while a reader of the state directory sees the
// new one from the journal, and a rotation writes the file before the
// journal moves on.
func TestWriteBehindRenewReachesTheRecord(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "x")
	flushRecords(t, s)
	s.stopFlusher()
	clock.Advance(time.Second)
	renewed, err := s.Renew(ctx, g.Lease.ID, g.Token, leasecore.Annotations{"client": "behind"})
	if err != nil {
		t.Fatal(err)
	}
	if hb := recordHeartbeat(t, state, g.Lease.ID); !hb.Equal(g.Lease.HeartbeatAt) {
		t.Fatalf("record heartbeat %v right after the renew with no flusher, want the old %v", hb, g.Lease.HeartbeatAt)
	}
	ro := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, ReadOnly: true}, NoDaemon: true})
	if l, err := ro.Live(ctx, "x"); err != nil || !l.HeartbeatAt.Equal(renewed.HeartbeatAt) || l.Client != "behind" {
		t.Errorf("read-only store sees %+v, %v; want the renewed lease", l, err)
	}

	s.seam.Lock()
	err = s.rotate()
	_, _, cached := s.cacheable(g.Lease.ID)
	lagging := len(s.lagging)
	s.seam.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if hb := recordHeartbeat(t, state, g.Lease.ID); !hb.Equal(renewed.HeartbeatAt) || lagging != 0 {
		t.Errorf("after a rotation: record heartbeat %v with %d records lagging, want %v and none", hb, lagging, renewed.HeartbeatAt)
	}
	if !cached {
		t.Error("the written-behind record is not cacheable: its entry lacks the file's stamp")
	}
}

// The flusher writes a lagging record on its own — here a new lease
// renewed twenty times — once for many changes.
func TestWriteBehindFlusherWritesRecords(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "x")
	var last leasecore.Lease
	for range 20 {
		clock.Advance(time.Second)
		var err error
		if last, err = s.Renew(ctx, g.Lease.ID, g.Token, nil); err != nil {
			t.Fatal(err)
		}
	}
	// The flusher runs on the real clock, recordLag after the first
	// change; the bound here only keeps a broken flusher from hanging the
	// test.
	deadline := time.Now().Add(30 * time.Second)
	for {
		data, err := os.ReadFile(recordPath(state, g.Lease.ID))
		l, _, derr := leasecore.DecodeRecord(data)
		if err == nil && derr == nil && l.HeartbeatAt.Equal(last.HeartbeatAt) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("record file %q (%v, %v), want heartbeat %v: the flusher never wrote it", data, err, derr, last.HeartbeatAt)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Creates and ends are written behind too: with the flusher stopped, a
// lease reserved, renewed and released has no record file, while a reader
// of the state directory sees it in the history from the journal; the
// checkpoint of Close writes the file once, already ended.
func TestWriteBehindCreateAndEnd(t *testing.T) {
	t.Parallel()
	s, clock, state := newStoreWithoutFlusher(t)
	ctx := context.Background()
	g := reserve(t, s, "x")
	clock.Advance(time.Second)
	if _, err := s.Renew(ctx, g.Lease.ID, g.Token, nil); err != nil {
		t.Fatal(err)
	}
	ended, err := s.Release(ctx, g.Lease.ID, g.Token, leasecore.StatusComplete, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(recordPath(state, g.Lease.ID)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("record file of a lease reserved and released with no flusher: %v, want none yet", err)
	}
	ro := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, ReadOnly: true}, NoDaemon: true})
	hist, err := ro.History(ctx, "x")
	if err != nil || len(hist) != 1 || hist[0].Status != leasecore.StatusComplete || !hist[0].HeartbeatAt.Equal(ended.HeartbeatAt) {
		t.Errorf("read-only store's history of x = %+v, %v; want the released lease", hist, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	l, _, err := leasecore.DecodeRecord(readFile(t, recordPath(state, g.Lease.ID)))
	if err != nil || l.Status != leasecore.StatusComplete || !l.HeartbeatAt.Equal(ended.HeartbeatAt) {
		t.Errorf("record after Close: %+v, %v; want it complete with heartbeat %v", l, err, ended.HeartbeatAt)
	}
}

// flushRecords writes every lagging record of s to its file, as the record
// flusher does within recordLag: tests that read record files call it
// first.
func flushRecords(t testing.TB, s *Store) {
	t.Helper()
	s.seam.Lock()
	err := s.flushLagging()
	s.seam.Unlock()
	if err != nil {
		t.Fatal(err)
	}
}

// A flusher batch writes without the store's mutex: a renew made while the
// batch holds recMu returns at once, its newer record stays lagging when
// the batch retires the older one it wrote, and the next batch writes it.
// A rotation that comes while a batch writes waits for it and writes the
// newest record itself; the batch then retires nothing.
func TestWriteBehindBatchWritesWithoutTheMutex(t *testing.T) {
	t.Parallel()
	s, clock, state := newStoreWithoutFlusher(t)
	ctx := context.Background()
	g := reserve(t, s, "x")

	b, ok := s.takeBatch(flushChunk)
	if !ok || len(b) != 1 || b[0].id != g.Lease.ID {
		t.Fatalf("takeBatch = %d records, %v; want the one of x", len(b), ok)
	}
	clock.Advance(time.Second)
	renewed := make(chan leasecore.Lease, 1)
	go func() {
		l, err := s.Renew(ctx, g.Lease.ID, g.Token, nil)
		if err != nil {
			t.Error(err)
		}
		renewed <- l
	}()
	var newer leasecore.Lease
	select {
	case newer = <-renewed:
	case <-time.After(30 * time.Second):
		t.Fatal("a renew waited for the flusher's batch")
	}
	if err := s.writeBatch(b); err != nil {
		t.Fatal(err)
	}
	if more := s.retireBatch(b); !more {
		t.Fatal("retireBatch: nothing lagging; want the renew's newer record")
	}
	if hb := recordHeartbeat(t, state, g.Lease.ID); !hb.Equal(g.Lease.HeartbeatAt) {
		t.Fatalf("record heartbeat %v after the batch, want the reservation's %v", hb, g.Lease.HeartbeatAt)
	}
	if more, err := s.flushBatch(flushChunk); err != nil || more {
		t.Fatalf("second batch: more %v, %v; want everything written", more, err)
	}
	if hb := recordHeartbeat(t, state, g.Lease.ID); !hb.Equal(newer.HeartbeatAt) {
		t.Fatalf("record heartbeat %v after the second batch, want the renew's %v", hb, newer.HeartbeatAt)
	}

	// A rotation during a batch.
	clock.Advance(time.Second)
	if _, err := s.Renew(ctx, g.Lease.ID, g.Token, nil); err != nil {
		t.Fatal(err)
	}
	if b, ok = s.takeBatch(flushChunk); !ok {
		t.Fatal("takeBatch: nothing lagging after a renew")
	}
	clock.Advance(time.Second)
	newest, err := s.Renew(ctx, g.Lease.ID, g.Token, nil)
	if err != nil {
		t.Fatal(err)
	}
	rotated := make(chan error, 1)
	go func() {
		s.seam.Lock()
		defer s.seam.Unlock()
		rotated <- s.rotate()
	}()
	if err := s.writeBatch(b); err != nil {
		t.Fatal(err)
	}
	if err := <-rotated; err != nil {
		t.Fatal(err)
	}
	if more := s.retireBatch(b); more {
		t.Error("records still lagging after a rotation and the batch")
	}
	if hb := recordHeartbeat(t, state, g.Lease.ID); !hb.Equal(newest.HeartbeatAt) {
		t.Errorf("record heartbeat %v after the rotation, want the newest renew's %v: the batch's older record won", hb, newest.HeartbeatAt)
	}
	s.seam.Lock()
	_, _, cached := s.cacheable(g.Lease.ID)
	s.seam.Unlock()
	if !cached {
		t.Error("the record is not cacheable: its entry lacks the file's stamp")
	}
}

// newStoreWithoutFlusher is newTestStore with the record flusher stopped:
// records lag until a test writes them.
func newStoreWithoutFlusher(t *testing.T) (*Store, *clocktest.FakeClock, string) {
	t.Helper()
	s, clock, state := newTestStore(t, Options{})
	s.stopFlusher()
	return s, clock, state
}
