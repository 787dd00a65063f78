package fusefs

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/internal/syncbuf"
	"github.com/leasefs/leasefs/leasecore"
)

// endThenFail is a store whose End ends the lease and then reports a
// failure, as when the holder's own release won the race against the
// unlink. With waitSeen, it first waits until Run has seen the release.
type endThenFail struct {
	leasecore.Store
	fsys     **FS
	waitSeen bool
	t        *testing.T
}

func (s endThenFail) End(ctx context.Context, id string, status leasecore.Status) (leasecore.Lease, error) {
	if _, err := s.Store.End(ctx, id, status); err != nil {
		return leasecore.Lease{}, err
	}
	if s.waitSeen {
		waitUntil(s.t, "Run to see the release", func() bool {
			u := &(*s.fsys).unlinked
			u.mu.Lock()
			defer u.mu.Unlock()
			return u.ids[id].seen
		})
	}
	return leasecore.Lease{}, leasecore.ErrInactive
}

// marks reports how many leases are marked as being unlinked.
func marks(f *FS) int {
	f.unlinked.mu.Lock()
	defer f.unlinked.mu.Unlock()
	return len(f.unlinked.ids)
}

// An unlink's mark lives only while it ends its lease: Run consumes the
// mark of the unlink's release without notifying the kernel, and an unlink
// whose end fails (another release won the race) leaves the name for Run
// to notify, whether Run saw that release before the failure or after.
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
		waitUntil(t, "the mark to go", func() bool { return marks(e.fsys) == 0 })
	})
	for _, waitSeen := range []bool{true, false} {
		name := "another release first, seen by Run before the failure"
		if !waitSeen {
			name = "another release first"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, leasecore.Options{})
			var log syncbuf.Buffer
			var f *FS
			f = New(endThenFail{Store: e.store, fsys: &f, waitSeen: waitSeen, t: t},
				Options{Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			_ = f.RawFileSystem()
			ctx := as(uidAlice)
			n, _ := mustCreate(t, ctx, f.root, "u")
			// Attached as the kernel bridge would, so that Run finds the
			// node to notify (NotifyDelete answers ENOSYS without a
			// server, and Run logs that).
			f.root.AddChild("u", n.EmbeddedInode(), false)
			startRun(t, f)
			// ENOENT, not ESTALE: the kernel would repeat the unlink
			// on whatever lease held the name by then.
			if errno := f.root.Unlink(ctx, "u"); !errors.Is(errno, syscall.ENOENT) {
				t.Fatalf("Unlink = %v, want ENOENT", errno)
			}
			waitUntil(t, "Run to notify the kernel of the ended lease", func() bool {
				return strings.Contains(log.String(), "notify delete failed") && strings.Contains(log.String(), "resource=u")
			})
			if n := marks(f); n != 0 {
				t.Errorf("%d marks left after the failed unlink", n)
			}
		})
	}
	t.Run("not the holder", func(t *testing.T) {
		e := newEnv(t, leasecore.Options{})
		mustCreate(t, as(uidAlice), e.root, "u")
		if errno := e.root.Unlink(as(uidBob), "u"); errno != syscall.EPERM {
			t.Fatalf("Unlink by another uid = %v, want EPERM", errno)
		}
		if n := marks(e.fsys); n != 0 {
			t.Errorf("a refused unlink left %d marks", n)
		}
	})
}

// An unlink ends the lease that its own lookup found, never one granted on
// the name after that lookup, even when another process's lookup has put
// the newer lease's node in the inode tree meanwhile: that lease stays, and
// the unlink answers ENOENT. Without a record of its lookup, an unlink ends
// the lease of the name's node in the tree.
func TestUnlinkEndsTheLeaseItLookedUp(t *testing.T) {
	other := func(uid uint32) context.Context { // a caller on another thread
		return fuse.NewContext(context.Background(), &fuse.Caller{Owner: fuse.Owner{Uid: uid, Gid: uid}, Pid: uint32(os.Getpid() + 1)})
	}
	for _, recorded := range []bool{true, false} {
		name := "its lookup recorded"
		if !recorded {
			name = "the inode tree"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, leasecore.Options{})
			ctx := as(uidAlice)
			n, _ := mustCreate(t, ctx, e.root, "u")
			lookupBy := other(uidAlice)
			if recorded {
				lookupBy = ctx
			}
			var out fuse.EntryOut
			found, errno := e.root.Lookup(lookupBy, "u", &out)
			if errno != 0 {
				t.Fatalf("Lookup: %v", errno)
			}
			e.root.AddChild("u", found, true)
			// Between that lookup and the UNLINK, the lease ends, the
			// name is granted to another caller, and another process
			// looks it up.
			if _, err := e.store.End(context.Background(), n.id, leasecore.StatusComplete); err != nil {
				t.Fatal(err)
			}
			g, err := e.store.Reserve(context.Background(), leasecore.Draft{Resource: "u", HolderUID: uidAlice})
			if err != nil {
				t.Fatal(err)
			}
			if recorded {
				newer, errno := e.root.Lookup(other(uidBob), "u", &out)
				if errno != 0 {
					t.Fatalf("Lookup of the newer lease: %v", errno)
				}
				e.root.AddChild("u", newer, true)
			}
			if errno := e.root.Unlink(ctx, "u"); errno != syscall.ENOENT {
				t.Fatalf("Unlink = %v, want ENOENT", errno)
			}
			if l, err := e.store.Live(context.Background(), "u"); err != nil || l.ID != g.Lease.ID {
				t.Fatalf("after the unlink, Live(u) = %+v, %v; want the lease granted after its lookup (%s)", l, err, g.Lease.ID)
			}
			if n := marks(e.fsys); n != 0 {
				t.Errorf("%d marks left", n)
			}
		})
	}
}
