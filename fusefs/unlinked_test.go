package fusefs

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/leasefs/leasefs/leasecore"
)

// endThenFail is a store whose End ends the lease and then reports a
// failure, as a commit whose outcome is unknown does (EIO).
type endThenFail struct{ leasecore.Store }

func (s endThenFail) End(ctx context.Context, id string, status leasecore.Status) (leasecore.Lease, error) {
	if _, err := s.Store.End(ctx, id, status); err != nil {
		return leasecore.Lease{}, err
	}
	return leasecore.Lease{}, &leasecore.PersistError{Op: "sync", Path: "journal", Err: syscall.EIO}
}

// An unlink marks its lease for Run only while it ends it: Run consumes the
// mark of a released lease, and an unlink that fails leaves no mark, so
// that Run invalidates the name as for any other end.
func TestUnlinkMarksItsLeaseForRun(t *testing.T) {
	t.Run("released", func(t *testing.T) {
		e := newEnv(t, leasecore.Options{})
		ctx := as(uidAlice)
		n, _ := mustCreate(t, ctx, e.root, "u")
		startRun(t, e.fsys)
		if errno := e.root.Unlink(ctx, "u"); errno != 0 {
			t.Fatalf("Unlink: %v", errno)
		}
		waitUntil(t, "Run to see the end", func() bool { return !hasToken(e.fsys, n.id) })
		if e.fsys.unlinked.take(n.id) {
			t.Error("the mark of the unlinked lease outlived its end")
		}
	})
	t.Run("end fails", func(t *testing.T) {
		e := newEnv(t, leasecore.Options{})
		f := newEnvOn(t, e.clock, e.store, endThenFail{e.store}).fsys
		root := f.root
		ctx := as(uidAlice)
		n, _ := mustCreate(t, ctx, root, "u")
		errno := root.Unlink(ctx, "u")
		if !errors.Is(errno, syscall.EIO) {
			t.Fatalf("Unlink = %v, want EIO", errno)
		}
		if f.unlinked.take(n.id) {
			t.Error("a failed unlink left its mark: Run would not invalidate the ended lease")
		}
	})
	t.Run("not the holder", func(t *testing.T) {
		e := newEnv(t, leasecore.Options{})
		n, _ := mustCreate(t, as(uidAlice), e.root, "u")
		if errno := e.root.Unlink(as(uidBob), "u"); errno != syscall.EPERM {
			t.Fatalf("Unlink by another uid = %v, want EPERM", errno)
		}
		if e.fsys.unlinked.take(n.id) {
			t.Error("a refused unlink left a mark")
		}
	})
}
