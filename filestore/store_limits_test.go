package filestore

import (
	"context"
	"errors"
	"github.com/leasefs/leasefs/leasecore"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestQuota(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t, Options{Options: leasecore.Options{MaxLeasesPerUID: 2}})
	ctx := context.Background()
	a := reserve(t, s, "a")
	reserve(t, s, "b")
	_, err := s.Reserve(ctx, leasecore.Draft{Resource: "c", HolderUID: 1000})
	wantErr(t, "third Reserve of uid 1000", err, leasecore.ErrQuota)
	if _, err := s.Reserve(ctx, leasecore.Draft{Resource: "c", HolderUID: 2000}); err != nil {
		t.Fatalf("Reserve by another uid: %v", err)
	}
	if _, err := s.Release(ctx, a.Lease.ID, a.Token, leasecore.StatusComplete, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, leasecore.Draft{Resource: "d", HolderUID: 1000}); err != nil {
		t.Fatalf("Reserve after a release: %v", err)
	}
}

// Dead leases are not live (docs/PROTOCOL.md §1), so they must not count against the
// quota of docs/PROTOCOL.md §7 even before anything touches or reaps them.
func TestQuotaIgnoresExpiredLeases(t *testing.T) {
	t.Parallel()
	s, clock, _ := newTestStore(t, Options{Options: leasecore.Options{MaxLeasesPerUID: 2}})
	reserve(t, s, "a")
	reserve(t, s, "b")
	clock.Advance(leasecore.DefaultLeaseDuration + time.Second)
	if _, err := s.Reserve(context.Background(), leasecore.Draft{Resource: "c", HolderUID: 1000}); err != nil {
		t.Fatalf("Reserve after the uid's leases expired: %v (expired leases still count against the quota)", err)
	}
}

func TestConcurrentReserveOneWinner(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t, Options{})
	const n = 32
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		grants = make(chan leasecore.Grant, n)
		errs   = make(chan error, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			g, err := s.Reserve(context.Background(), leasecore.Draft{Resource: "contended", HolderUID: uint32(i)})
			if err != nil {
				errs <- err
				return
			}
			grants <- g
		})
	}
	close(start)
	wg.Wait()
	close(grants)
	close(errs)
	var winner leasecore.Grant
	for g := range grants {
		if winner.Lease.ID != "" {
			t.Fatalf("two grants: %s and %s", winner.Lease.ID, g.Lease.ID)
		}
		winner = g
	}
	if winner.Lease.ID == "" {
		t.Fatal("no grant")
	}
	held := 0
	for err := range errs {
		var he *leasecore.LeaseHeldError
		if !errors.As(err, &he) || he.Holder.ID != winner.Lease.ID {
			t.Errorf("loser error = %v, want *LeaseHeldError naming %s", err, winner.Lease.ID)
		}
		held++
	}
	if held != n-1 {
		t.Errorf("%d ErrHeld, want %d", held, n-1)
	}
}

func TestClosedStore(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t, Options{})
	g := reserve(t, s, "x")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	ctx := context.Background()
	_, err := s.Reserve(ctx, leasecore.Draft{Resource: "y"})
	wantErr(t, "Reserve after Close", err, leasecore.ErrClosed)
	_, err = s.Live(ctx, "x")
	wantErr(t, "Live after Close", err, leasecore.ErrClosed)
	_, err = s.Renew(ctx, g.Lease.ID, g.Token, leasecore.Annotations{})
	wantErr(t, "Renew after Close", err, leasecore.ErrClosed)
}

func TestInvalidDrafts(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t, Options{})
	ctx := context.Background()
	tests := []struct {
		d    leasecore.Draft
		want error
	}{
		{leasecore.Draft{Resource: ""}, leasecore.ErrInvalidName},
		{leasecore.Draft{Resource: "../x"}, leasecore.ErrInvalidName},
		{leasecore.Draft{Resource: strings.Repeat("n", 256)}, leasecore.ErrNameTooLong},
		{leasecore.Draft{Resource: "x", Mode: "shared"}, leasecore.ErrInvalidArgument},
		{leasecore.Draft{Resource: "x", Annotations: leasecore.Annotations{"client": strings.Repeat("c", 1025)}}, leasecore.ErrInvalidArgument},
		{leasecore.Draft{Resource: "x", Annotations: leasecore.Annotations{"anchor_state": "a\x00b"}}, leasecore.ErrInvalidArgument},
	}
	for _, tc := range tests {
		_, err := s.Reserve(ctx, tc.d)
		wantErr(t, "Reserve "+tc.d.Resource, err, tc.want)
	}
	if list, _ := s.List(ctx); len(list) != 0 {
		t.Fatalf("refused drafts left leases: %+v", list)
	}
	if g := reserve(t, s, "x"); g.Lease.Generation != 1 {
		t.Errorf("refused drafts consumed generations: first grant has generation %d", g.Lease.Generation)
	}
}

func TestNamespaceQuota(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t, Options{Options: leasecore.Options{MaxLeasesPerUID: 2}})
	ctx := context.Background()
	for _, p := range []string{"a", "b"} {
		if _, err := s.Mkdir(ctx, p, 1000, 1000); err != nil {
			t.Fatalf("Mkdir(%s): %v", p, err)
		}
	}
	if _, err := s.Mkdir(ctx, "c", 1000, 1000); !errors.Is(err, leasecore.ErrQuota) {
		t.Fatalf("third Mkdir by one uid = %v, want ErrQuota", err)
	}
	if _, err := s.Mkdir(ctx, "c", 1001, 1001); err != nil {
		t.Fatalf("Mkdir by another uid: %v", err)
	}
}

func TestGenerationOutOfRangeRejected(t *testing.T) {
	t.Parallel()
	for _, gen := range []string{"-5", "281474976710657"} {
		rec := "lease_id = \"lease-abc\"\nthread = \"a\"\ntoken_hash = \"00\"\nheartbeat_at = \"2026-11-30T02:00:00Z\"\n" +
			"started_at = \"2026-11-30T02:00:00Z\"\nstatus = \"active\"\ngeneration = " + gen + "\n"
		if _, _, err := leasecore.DecodeRecord([]byte(rec)); err == nil {
			t.Errorf("record with generation %s accepted", gen)
		}
	}
}
