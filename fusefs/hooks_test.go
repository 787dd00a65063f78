package fusefs

import (
	"context"
	"github.com/leasefs/leasefs/internal/engine"
	"log/slog"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// hookCalls records the calls of Options.OnRefuse and Options.OnHandoff.
// Safe for concurrent use.
type hookCalls struct {
	mu       sync.Mutex
	refusals []string // "op errno"
	handoffs []time.Duration
}

func (c *hookCalls) refuse(op string, errno syscall.Errno) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refusals = append(c.refusals, op+" "+errnoName(errno))
}

func (c *hookCalls) handoff(wait time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handoffs = append(c.handoffs, wait)
}

func (c *hookCalls) get() ([]string, []time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.refusals), slices.Clone(c.handoffs)
}

// OnRefuse sees every refusal once, with the errno the caller gets, and
// OnHandoff sees a blocking flock granted after a wait; a lock taken
// without waiting is no handoff.
func TestHooksSeeRefusalsAndHandoffs(t *testing.T) {
	clock := clocktest.NewFakeClock(time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC))
	store := engine.NewMemStore(leasecore.Options{Clock: clock, Host: "testhost", Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { _ = store.Close() })
	var calls hookCalls
	f := New(store, Options{Logger: slog.New(slog.DiscardHandler), OnRefuse: calls.refuse, OnHandoff: calls.handoff})
	_ = f.RawFileSystem()
	root := f.root

	n, holder := mustCreate(t, as(uidAlice), root, "q")
	if errno := holder.Setlk(as(uidAlice), 1, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK); errno != 0 {
		t.Fatalf("holder flock: %v", errno)
	}
	if _, _, _, errno := create(t, as(uidBob), root, "q", syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDONLY); errno != syscall.EEXIST {
		t.Fatalf("O_EXCL create of a held name = %v, want EEXIST", errno)
	}
	waiter := openAs(t, n, uidBob, syscall.O_RDONLY)
	if errno := waiter.Setlk(as(uidBob), 2, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK); errno != syscall.EWOULDBLOCK {
		t.Fatalf("flock -n on a held name = %v, want EWOULDBLOCK", errno)
	}
	handOff(t, store, "q", holder, waiter)

	refusals, handoffs := calls.get()
	if want := []string{"create EEXIST", "flock EAGAIN"}; !slices.Equal(refusals, want) {
		t.Errorf("OnRefuse saw %q, want %q", refusals, want)
	}
	if len(handoffs) != 1 || handoffs[0] < 0 {
		t.Errorf("OnHandoff saw %v, want one wait", handoffs)
	}
	if l, err := store.Live(context.Background(), "q"); err != nil || l.HolderUID != uidBob {
		t.Errorf("after the handoff the lease is %+v, %v; want bob's", l, err)
	}
}
