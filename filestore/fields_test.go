package filestore

import (
	"context"
	"errors"
	"github.com/leasefs/leasefs/leasecore"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/testenv"
	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// Annotations sent with a release are recorded, then the lease ends.
func TestReleaseAppliesAnnotations(t *testing.T) {
	t.Parallel()
	for _, status := range []leasecore.Status{leasecore.StatusComplete, leasecore.StatusAbandoned} {
		t.Run(string(status), func(t *testing.T) {
			t.Parallel()
			s, _, state := newTestStore(t, Options{})
			ctx := context.Background()
			g := reserve(t, s, "x")
			l, err := s.Release(ctx, g.Lease.ID, g.Token, status, leasecore.Annotations{"anchor_state": "deadbeef", "client": "ci"})
			if err != nil {
				t.Fatal(err)
			}
			if l.Status != status || l.AnchorState != "deadbeef" || l.Client != "ci" {
				t.Fatalf("released lease = %+v", l)
			}
			hist, err := s.History(ctx, "x")
			if err != nil || len(hist) != 1 || hist[0].AnchorState != "deadbeef" {
				t.Fatalf("History = %+v, %v", hist, err)
			}
			flushRecords(t, s)
			if rec := readRecordMap(t, recordPath(state, g.Lease.ID)); rec["anchor_state"] != "deadbeef" || rec["status"] != string(status) {
				t.Errorf("record = %v", rec)
			}
		})
	}
}

// A release whose annotations are invalid changes nothing.
func TestReleaseWithBadAnnotationsChangesNothing(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "x")
	_, err := s.Release(ctx, g.Lease.ID, g.Token, leasecore.StatusComplete, leasecore.Annotations{"anchor_state": "a\x00b"})
	wantErr(t, "Release with a NUL annotation", err, leasecore.ErrInvalidArgument)
	if l, err := s.Live(ctx, "x"); err != nil || l.AnchorState != "" {
		t.Fatalf("lease after a refused release = %+v, %v", l, err)
	}
}

// Waiter counts show on the live lease and reach read-only stores (ls)
// while a daemon serves the directory, and only then.
func TestWaitersArePublished(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()
	reserve(t, s, "x")
	wctx, cancel := context.WithCancel(ctx)
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := s.Acquire(wctx, leasecore.Draft{Resource: "x", Mode: leasecore.ModeHandle})
			errs <- err
		}()
	}
	testenv.WaitFor(t, "two waiters", func() bool {
		l, err := s.Live(ctx, "x")
		return err == nil && l.Waiters == 2
	})
	// The daemon's writer publishes the counts soon after they change.
	testenv.WaitFor(t, "two waiters in a read-only store", func() bool {
		ro, err := Open(state, Options{Options: leasecore.Options{Clock: clock, ReadOnly: true, Logger: quietLogger}})
		if err != nil {
			t.Fatal(err)
		}
		defer ro.Close()
		l, err := ro.Live(ctx, "x")
		return err == nil && l.Waiters == 2
	})
	noDaemon := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, ReadOnly: true}, NoDaemon: true})
	if l, err := noDaemon.Live(ctx, "x"); err != nil || l.Waiters != 0 {
		t.Errorf("read-only Live without a daemon = %+v, %v; want no waiters", l, err)
	}
	cancel()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled Acquire = %v, want context.Canceled", err)
		}
	}
	testenv.WaitFor(t, "the waiters file removed after the last waiter left", func() bool {
		_, err := os.Stat(filepath.Join(state, waitersName))
		return os.IsNotExist(err)
	})
}

// A read-only store without a lease duration of its own judges expiry with
// the duration the directory was last served with.
func TestReadOnlyStoreAdoptsServedLeaseDuration(t *testing.T) {
	t.Parallel()
	clock := clocktest.NewFakeClock(testStart)
	state := t.TempDir()
	s := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, LeaseDuration: 30 * time.Minute}})
	g := reserve(t, s, "x")
	clock.Advance(10 * time.Minute) // past the default 5 minutes, within 30
	ro := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, ReadOnly: true}})
	if ro.LeaseDuration() != 30*time.Minute {
		t.Errorf("read-only LeaseDuration = %v, want the served 30m", ro.LeaseDuration())
	}
	l, err := ro.Live(context.Background(), "x")
	if err != nil || !l.ExpiresAt.Equal(g.Lease.HeartbeatAt.Add(30*time.Minute)) {
		t.Errorf("read-only Live = %+v, %v; want live, expiring 30m after its heartbeat", l, err)
	}
}

// An optional field that is unset is omitted from the record, never
// written as 0 or "": the reference store reads pid = 0 as a recorded pid.
func TestRecordOmitsUnsetOptionalFields(t *testing.T) {
	t.Parallel()
	s, _, state := newTestStore(t, Options{})
	g := reserve(t, s, "x")
	flushRecords(t, s)
	rec := readRecordMap(t, recordPath(state, g.Lease.ID))
	for _, k := range []string{"pid", "pid_start_ticks", "completed_at", "actor_session_id", "task_assignment_id",
		"anchor_state", "anchor_root", "path", "client", "takeover_requested_by", "takeover_requested_at",
		"takeover_reason", "waiters", "expires_at"} {
		if v, ok := rec[k]; ok {
			t.Errorf("record of a lease without %s writes %s = %#v", k, k, v)
		}
	}
	if _, err := s.Renew(context.Background(), g.Lease.ID, g.Token, leasecore.Annotations{"pid": "0", "client": ""}); err != nil {
		t.Fatal(err)
	}
	flushRecords(t, s)
	rec = readRecordMap(t, recordPath(state, g.Lease.ID))
	for _, k := range []string{"pid", "pid_start_ticks", "client"} {
		if v, ok := rec[k]; ok {
			t.Errorf("record after clearing %s writes %s = %#v", k, k, v)
		}
	}
}
