package leasecore

import (
	"context"
	"testing"
	"time"
)

// recordHeartbeat returns the heartbeat in the record file of lease id.
func recordHeartbeat(t *testing.T, state, id string) time.Time {
	t.Helper()
	l, _, err := decodeRecord(readFile(t, recordPath(state, id)))
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
	s.stopFlusher()
	clock.Advance(time.Second)
	renewed, err := s.Renew(ctx, g.Lease.ID, g.Token, Annotations{"client": "behind"})
	if err != nil {
		t.Fatal(err)
	}
	if hb := recordHeartbeat(t, state, g.Lease.ID); !hb.Equal(g.Lease.HeartbeatAt) {
		t.Fatalf("record heartbeat %v right after the renew with no flusher, want the old %v", hb, g.Lease.HeartbeatAt)
	}
	ro := openStore(t, state, Options{Clock: clock, ReadOnly: true, NoDaemon: true})
	if l, err := ro.Live(ctx, "x"); err != nil || !l.HeartbeatAt.Equal(renewed.HeartbeatAt) || l.Client != "behind" {
		t.Errorf("read-only store sees %+v, %v; want the renewed lease", l, err)
	}

	s.mu.Lock()
	err = s.rotate()
	e := s.leases[g.Lease.ID]
	_, cached := cacheable(e)
	lagging := len(s.lagging)
	s.mu.Unlock()
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

// The flusher writes a lagging record on its own, once for many renews.
func TestWriteBehindFlusherWritesRecords(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "x")
	var last Lease
	for range 20 {
		clock.Advance(time.Second)
		var err error
		if last, err = s.Renew(ctx, g.Lease.ID, g.Token, nil); err != nil {
			t.Fatal(err)
		}
	}
	// The flusher runs on the real clock, recordLag after the first renew;
	// the bound here only keeps a broken flusher from hanging the test.
	deadline := time.Now().Add(30 * time.Second)
	for !recordHeartbeat(t, state, g.Lease.ID).Equal(last.HeartbeatAt) {
		if time.Now().After(deadline) {
			t.Fatalf("record heartbeat still %v, want %v: the flusher never wrote it", recordHeartbeat(t, state, g.Lease.ID), last.HeartbeatAt)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Changes that create or end a lease are in their record files when they
// return; a release after written-behind renews supersedes them.
func TestWriteBehindLeavesCreateAndEndDirect(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "x")
	s.stopFlusher()
	if hb := recordHeartbeat(t, state, g.Lease.ID); !hb.Equal(g.Lease.HeartbeatAt) {
		t.Fatalf("new record heartbeat %v, want %v", hb, g.Lease.HeartbeatAt)
	}
	clock.Advance(time.Second)
	if _, err := s.Renew(ctx, g.Lease.ID, g.Token, nil); err != nil {
		t.Fatal(err)
	}
	ended, err := s.Release(ctx, g.Lease.ID, g.Token, StatusComplete, nil)
	if err != nil {
		t.Fatal(err)
	}
	l, _, err := decodeRecord(readFile(t, recordPath(state, g.Lease.ID)))
	if err != nil || l.Status != StatusComplete || !l.HeartbeatAt.Equal(ended.HeartbeatAt) {
		t.Errorf("record after the release: %+v, %v; want it complete with heartbeat %v", l, err, ended.HeartbeatAt)
	}
	s.mu.Lock()
	lagging := len(s.lagging)
	s.mu.Unlock()
	if lagging != 0 {
		t.Errorf("%d records lagging after the release, want none", lagging)
	}
}
