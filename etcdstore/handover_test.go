package etcdstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/leasefs/leasefs/etcdstore"
	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/internal/testenv"
	"github.com/leasefs/leasefs/leasecore"
)

// TestHandOverIsNeverBarged checks that while a waiter queues for a name,
// no other request is granted ahead of it, from any mount
// (docs/PROTOCOL.md §8a, "Hand-over"): the holder on mount A ends its
// lease and, at once, mount A and mount C try to reserve the free name;
// both must find it held by the waiter of mount B, which is granted.
func TestHandOverIsNeverBarged(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	a := openAt(t, srv, "/barge", etcdstore.Options{})
	b := openAt(t, srv, "/barge", etcdstore.Options{})
	c := openAt(t, srv, "/barge", etcdstore.Options{})
	draft := leasecore.Draft{Resource: "job", HolderUID: 1000, HolderGID: 1000, Mode: leasecore.ModeToken}
	for i := range 20 {
		held, err := a.Reserve(ctx, draft)
		if err != nil {
			t.Fatalf("round %d: reserve through A: %v", i, err)
		}
		granted := make(chan leasecore.Grant, 1)
		go func() {
			g, err := b.Acquire(ctx, draft)
			if err != nil {
				t.Errorf("Acquire through B: %v", err)
			}
			granted <- g
		}()
		testenv.WaitFor(t, "A to see B's waiter", func() bool {
			_, _, wa := a.Known("job")
			return wa > 0
		})
		if _, err := a.End(ctx, held.Lease.ID, leasecore.StatusComplete); err != nil {
			t.Fatal(err)
		}
		barge := make(chan error, 2)
		for _, s := range []*etcdstore.Store{a, c} {
			go func() {
				g, err := s.Reserve(ctx, draft)
				if err == nil {
					err = errors.New("granted lease " + g.Lease.ID + " ahead of the waiter")
					s.End(ctx, g.Lease.ID, leasecore.StatusComplete) // so that the waiter is served
				}
				barge <- err
			}()
		}
		errs := []error{<-barge, <-barge}
		g := <-granted
		for _, err := range errs {
			var he *leasecore.LeaseHeldError
			if !errors.As(err, &he) || he.Holder.ID != g.Lease.ID {
				t.Fatalf("round %d: a reservation while B's waiter queued: %v; want held by B's grant %s", i, err, g.Lease.ID)
			}
		}
		if _, err := b.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
			t.Fatal(err)
		}
	}
}
