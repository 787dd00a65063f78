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

// TestNamespacesAcrossStores checks what a namespace lookup promises
// (docs/PROTOCOL.md §8a, "Namespaces"): a namespace created through one
// store is found by another's next lookup, though that store answers
// lookups of namespaces it knows without a round trip; one removed
// through the first fails the second's reservation in it with
// ErrNoNamespace at once, and leaves its lookups once its watch shows the
// removal.
func TestNamespacesAcrossStores(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx := context.Background()
	a := openAt(t, srv, "/nsx", etcdstore.Options{})
	b := openAt(t, srv, "/nsx", etcdstore.Options{})

	if ns, l, err := b.ReadName(ctx, "team"); ns != nil || l != nil || err != nil {
		t.Fatalf("b: team before mkdir: %v %v %v", ns, l, err)
	}
	if _, err := a.Mkdir(ctx, "team", 1000, 1000); err != nil {
		t.Fatal(err)
	}
	ns, _, err := b.ReadName(ctx, "team")
	if err != nil || ns == nil || ns.UID != 1000 {
		t.Fatalf("b: team right after a's mkdir: %v, %v; want the namespace of uid 1000", ns, err)
	}
	if _, err := b.Reserve(ctx, leasecore.Draft{Resource: "team/job", HolderUID: 1000, HolderGID: 1000, Mode: leasecore.ModeToken}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Reserve(ctx, leasecore.Draft{Resource: "team/other", HolderUID: 1000, HolderGID: 1000, Mode: leasecore.ModeToken}); err != nil {
		t.Fatal(err)
	}
	// Empty the namespace through a, then remove it there.
	for _, name := range []string{"team/job", "team/other"} {
		l, err := a.Live(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.End(ctx, l.ID, leasecore.StatusComplete); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Rmdir(ctx, "team"); err != nil {
		t.Fatal(err)
	}
	// b may still find it for a moment; a change in it fails at once.
	_, err = b.Reserve(ctx, leasecore.Draft{Resource: "team/job", HolderUID: 1000, HolderGID: 1000, Mode: leasecore.ModeToken})
	if !errors.Is(err, leasecore.ErrNoNamespace) {
		t.Fatalf("b: reserve in a removed namespace: %v; want ErrNoNamespace", err)
	}
	testenv.WaitFor(t, "b's lookup to show team removed", func() bool {
		ns, _, err := b.ReadName(ctx, "team")
		return err == nil && ns == nil
	})
	if _, err := b.Namespace(ctx, "team"); !errors.Is(err, leasecore.ErrNotFound) {
		t.Fatalf("b: Namespace(team) after the removal: %v; want ErrNotFound", err)
	}
	// Created again elsewhere: found again.
	if _, err := a.Mkdir(ctx, "team", 2000, 2000); err != nil {
		t.Fatal(err)
	}
	if ns, err := b.Namespace(ctx, "team"); err != nil || ns.UID != 2000 {
		t.Fatalf("b: team created again: %v, %v; want uid 2000", ns, err)
	}
}
