package filestore

import (
	"context"

	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/internal/testenv"
	"github.com/leasefs/leasefs/leasecore"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestHolderPIDDeathEndsLease(t *testing.T) {
	t.Parallel()
	s, clock, _ := newTestStore(t, Options{})
	ctx := context.Background()
	child := testenv.StartSleeper(t)
	pid := child.Process.Pid
	g, err := s.Reserve(ctx, leasecore.Draft{Resource: "x", Annotations: leasecore.Annotations{"pid": strconv.Itoa(pid)}})
	if err != nil {
		t.Fatal(err)
	}
	ticks, _ := procfs.StartTicks(pid)
	if g.Lease.PID != pid || g.Lease.PIDStartTicks != ticks || ticks == 0 {
		t.Fatalf("lease pid %d ticks %d, want %d %d", g.Lease.PID, g.Lease.PIDStartTicks, pid, ticks)
	}
	if _, err := s.Live(ctx, "x"); err != nil {
		t.Fatalf("Live while the holder runs: %v", err)
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	child.Wait()
	clock.Advance(time.Second)

	_, err = s.Live(ctx, "x")
	wantErr(t, "Live after the holder process died", err, leasecore.ErrNotFound)
	reap(t, s) // reads are pure: the reaper ends the dead lease
	hist, err := s.History(ctx, "x")
	if err != nil || len(hist) != 1 || hist[0].ID != g.Lease.ID || hist[0].Status != leasecore.StatusAbandoned ||
		!hist[0].CompletedAt.Equal(clock.Now()) {
		t.Fatalf("History = %+v, %v; want %s abandoned", hist, err, g.Lease.ID)
	}
	reserve(t, s, "x")
}

func TestHolderPIDAnnotationOnRenew(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "x")
	child := testenv.StartSleeper(t)
	pid := child.Process.Pid
	l, err := s.Renew(ctx, g.Lease.ID, g.Token, leasecore.Annotations{"pid": strconv.Itoa(pid)})
	if err != nil || l.PID != pid {
		t.Fatalf("Renew with pid = %+v, %v", l, err)
	}
	zero := 0
	l, err = s.Renew(ctx, g.Lease.ID, g.Token, leasecore.Annotations{"pid": strconv.Itoa(zero)})
	if err != nil || l.PID != 0 || l.PIDStartTicks != 0 {
		t.Fatalf("Renew with pid 0 did not clear it: %+v, %v", l, err)
	}
	child.Process.Kill()
	child.Wait()
	if _, err := s.Live(ctx, "x"); err != nil {
		t.Fatalf("a cleared pid still kills the lease: %v", err)
	}
}

func TestNotRunningPIDRefused(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t, Options{})
	ctx := context.Background()
	for _, pid := range []int{testenv.ExitedPID(t), -1, 1 << 30} {
		_, err := s.Reserve(ctx, leasecore.Draft{Resource: "x", Annotations: leasecore.Annotations{"pid": strconv.Itoa(pid)}})
		wantErr(t, "Reserve with pid "+strconv.Itoa(pid), err, leasecore.ErrInvalidArgument)
	}
	g := reserve(t, s, "x")
	bad := testenv.ExitedPID(t)
	_, err := s.Renew(ctx, g.Lease.ID, g.Token, leasecore.Annotations{"pid": strconv.Itoa(bad)})
	wantErr(t, "Renew with a dead pid", err, leasecore.ErrInvalidArgument)
	if l, err := s.Live(ctx, "x"); err != nil || l.PID != 0 {
		t.Fatalf("refused renew changed the lease: %+v, %v", l, err)
	}
}

// rewriteRecord decodes the record of id, applies mut and writes it back.
func rewriteRecord(t *testing.T, state, id string, mut func(*rec)) {
	t.Helper()
	l, hash, err := leasecore.DecodeRecord(readFile(t, recordPath(state, id)))
	if err != nil {
		t.Fatal(err)
	}
	r := &rec{Lease: l, hash: hash}
	mut(r)
	writeRecordFile(t, state, r)
}

func TestBootIDMismatchEndsLease(t *testing.T) {
	t.Parallel()
	if procfs.BootID() == "" {
		t.Skip("no boot id on this machine")
	}
	for _, withPID := range []bool{false, true} {
		t.Run("pid="+strconv.FormatBool(withPID), func(t *testing.T) {
			t.Parallel()
			s, clock, state := newTestStore(t, Options{})
			ctx := context.Background()
			g := reserve(t, s, "x")
			other := reserve(t, s, "y")
			s.Close()
			rewriteRecord(t, state, g.Lease.ID, func(r *rec) {
				r.BootID = "other-boot"
				if withPID {
					// A pid from another boot says nothing about this boot's
					// processes; our own pid is running, and must not save it.
					r.PID = os.Getpid()
				}
			})
			s2 := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
			_, err := s2.Live(ctx, "x")
			wantErr(t, "Live of a lease from another boot", err, leasecore.ErrNotFound)
			l, err := s2.Load(ctx, g.Lease.ID)
			if err != nil || l.Status != leasecore.StatusAbandoned || l.CompletedAt.IsZero() {
				t.Fatalf("lease from another boot = %+v, %v", l, err)
			}
			if _, err := s2.Live(ctx, "y"); err != nil {
				t.Fatalf("lease %s of this boot: %v", other.Lease.ID, err)
			}
		})
	}
}

func TestPIDReuseEndsLease(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()
	self := os.Getpid()
	g, err := s.Reserve(ctx, leasecore.Draft{Resource: "x", Annotations: leasecore.Annotations{"pid": strconv.Itoa(self)}})
	if err != nil {
		t.Fatal(err)
	}
	reused, err := s.Reserve(ctx, leasecore.Draft{Resource: "reused", Annotations: leasecore.Annotations{"pid": strconv.Itoa(self)}})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	rewriteRecord(t, state, reused.Lease.ID, func(r *rec) { r.PIDStartTicks++ })
	s2 := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
	if _, err := s2.Live(ctx, "x"); err != nil {
		t.Fatalf("lease of a running pid with its start time: %v", err)
	}
	_, err = s2.Live(ctx, "reused")
	wantErr(t, "Live of a lease whose pid was reused", err, leasecore.ErrNotFound)
	s2.Close()

	// A reference record has a pid but no start time: existence decides.
	rewriteRecord(t, state, g.Lease.ID, func(r *rec) { r.PIDStartTicks = 0 })
	s3 := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
	if _, err := s3.Live(ctx, "x"); err != nil {
		t.Fatalf("pid without start time, process running: %v", err)
	}
}

func TestBootIDFormat(t *testing.T) {
	t.Parallel()
	id := procfs.BootID()
	if id == "" {
		t.Skip("no boot id")
	}
	if id != strings.TrimSpace(id) || len(id) != 36 || strings.Count(id, "-") != 4 {
		t.Errorf("procfs.BootID() = %q, want a UUID", id)
	}
	if procfs.BootID() != id {
		t.Error("BootID not stable")
	}
}

// The pid and boot-id rules, and the ending of handle leases at open,
// apply only to leases recorded by this host: on a store shared with other
// machines, another host's pids and boots say nothing here.
func TestLivenessRulesAreHostLocal(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{Options: leasecore.Options{Host: "here"}})
	ctx := context.Background()
	child := testenv.StartSleeper(t)
	pid := strconv.Itoa(child.Process.Pid)
	mine, err := s.Reserve(ctx, leasecore.Draft{Resource: "mine", Annotations: leasecore.Annotations{"pid": pid}})
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := s.Reserve(ctx, leasecore.Draft{Resource: "theirs", Annotations: leasecore.Annotations{"pid": pid}})
	if err != nil {
		t.Fatal(err)
	}
	handle, err := s.Reserve(ctx, leasecore.Draft{Resource: "their-handle", Mode: leasecore.ModeHandle})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	child.Process.Kill()
	child.Wait()
	for _, id := range []string{theirs.Lease.ID, handle.Lease.ID} {
		rewriteRecord(t, state, id, func(r *rec) { r.Host, r.BootID = "there", "their-boot" })
	}
	s2 := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, Host: "here"}})
	_, err = s2.Live(ctx, "mine")
	wantErr(t, "Live of this host's lease whose pid died", err, leasecore.ErrNotFound)
	if l, err := s2.Live(ctx, "theirs"); err != nil || l.ID != theirs.Lease.ID {
		t.Errorf("another host's lease with a pid not running here = %+v, %v; want live", l, err)
	}
	if l, err := s2.Live(ctx, "their-handle"); err != nil || l.Mode != leasecore.ModeHandle {
		t.Errorf("another host's handle lease after a restart here = %+v, %v; want live", l, err)
	}
	_ = mine
}
