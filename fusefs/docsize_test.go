package fusefs

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/leasecore"
)

// The cached st_size follows every change of the lease: it is always the
// length of the document a read returns at that moment.
func TestStatSizeFollowsChanges(t *testing.T) {
	e := newEnv(t, leasecore.Options{LeaseDuration: time.Minute})
	ctx := as(uidAlice)
	n, h := mustCreate(t, ctx, e.root, "s")
	tok := readToken(t, ctx, h)
	check := func(what string) {
		t.Helper()
		var out fuse.AttrOut
		if errno := n.Getattr(ctx, nil, &out); errno != 0 {
			t.Fatalf("%s: Getattr: %v", what, errno)
		}
		if doc := readDoc(t, ctx, h, 4096); out.Size != uint64(len(doc)) {
			t.Errorf("%s: st_size %d, want the document's length %d", what, out.Size, len(doc))
		}
	}
	check("reserved")
	check("unchanged") // a hit
	for i, payload := range []string{
		"token = \"" + tok + "\"\nclient = \"a much longer client name than before\"\n",
		"token = \"" + tok + "\"\nclient = \"b\"\n", // shorter again
		tok, // a renewal: new heartbeat and expiry
	} {
		e.clock.Advance(time.Second)
		if errno := write(ctx, h, payload); errno != 0 {
			t.Fatalf("write %d: %v", i, errno)
		}
		check("after write " + strconv.Itoa(i))
	}
	// A waiter count is part of the document.
	waiter := openAs(t, n, uidBob, syscall.O_RDONLY)
	wctx, cancel := interruptible(uidBob)
	done := make(chan syscall.Errno, 1)
	go func() { done <- waiter.Setlkw(wctx, 9, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK) }()
	waitUntil(t, "the waiter to queue", func() bool {
		l, err := e.store.Load(context.Background(), n.id)
		return err == nil && l.Waiters == 1
	})
	check("with a waiter")
	cancel()
	if errno := <-done; errno != syscall.EINTR {
		t.Errorf("interrupted wait = %v, want EINTR", errno)
	}
	check("waiter gone")
}

// An entry is dropped when its lease ends, and the cache never grows past
// its bound.
func TestDocSizesForgetAndBound(t *testing.T) {
	var d docSizes
	l := leasecore.Lease{ID: "lease-a", Resource: "a", Status: leasecore.StatusActive}
	if got, want := d.size(l), uint64(len(leasecore.StatusDocument(l))); got != want {
		t.Fatalf("size = %d, want %d", got, want)
	}
	d.forget(l.ID)
	if _, ok := d.sizes[l.ID]; ok {
		t.Error("forget kept the entry")
	}
	for i := range maxDocSizes + 10 {
		l.ID = "lease-" + strconv.Itoa(i)
		d.size(l)
	}
	if len(d.sizes) > maxDocSizes {
		t.Errorf("%d entries, want at most %d", len(d.sizes), maxDocSizes)
	}
}
