package filestore

import (
	"context"
	"fmt"
	"github.com/leasefs/leasefs/leasecore"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasefs/leasefs/leasecore/clocktest"
)

func TestNamespaces(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()

	_, err := s.Reserve(ctx, leasecore.Draft{Resource: "a/b"})
	wantErr(t, "Reserve a/b without namespace a", err, leasecore.ErrNoNamespace)
	_, err = s.Mkdir(ctx, "a/b", 0, 0)
	wantErr(t, "Mkdir a/b without a", err, leasecore.ErrNoNamespace)
	_, err = s.Mkdir(ctx, "a/../b", 0, 0)
	wantErr(t, "Mkdir a/../b", err, leasecore.ErrInvalidName)

	ns, err := s.Mkdir(ctx, "a", 1000, 100)
	if err != nil || ns.Path != "a" || ns.UID != 1000 || ns.GID != 100 || !ns.CreatedAt.Equal(testStart.Truncate(time.Millisecond)) {
		t.Fatalf("Mkdir a = %+v, %v", ns, err)
	}
	_, err = s.Mkdir(ctx, "a", 0, 0)
	wantErr(t, "Mkdir a twice", err, leasecore.ErrExists)
	_, err = s.Reserve(ctx, leasecore.Draft{Resource: "a"})
	wantErr(t, "Reserve on namespace a", err, leasecore.ErrIsNamespace)

	ab := reserve(t, s, "a/b")
	err = s.Rmdir(ctx, "a")
	wantErr(t, "Rmdir a while a/b is live", err, leasecore.ErrNotEmpty)
	_, err = s.Mkdir(ctx, "a/b", 0, 0)
	wantErr(t, "Mkdir on live lease a/b", err, leasecore.ErrExists)

	reserve(t, s, "top")
	if _, err := s.Mkdir(ctx, "a/sub", 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Mkdir(ctx, "z", 0, 0); err != nil {
		t.Fatal(err)
	}
	reserve(t, s, "a/sub/deep")

	checkDir := func(s *Store, dir string, wantNS, wantLeases []string) {
		t.Helper()
		nss, leases, err := s.ListDir(ctx, dir)
		if err != nil {
			t.Fatalf("ListDir(%q): %v", dir, err)
		}
		var gotNS, gotLeases []string
		for _, n := range nss {
			gotNS = append(gotNS, n.Path)
		}
		for _, l := range leases {
			gotLeases = append(gotLeases, l.Resource)
		}
		if fmt.Sprint(gotNS) != fmt.Sprint(wantNS) || fmt.Sprint(gotLeases) != fmt.Sprint(wantLeases) {
			t.Errorf("ListDir(%q) = %v %v, want %v %v", dir, gotNS, gotLeases, wantNS, wantLeases)
		}
	}
	checkDir(s, "", []string{"a", "z"}, []string{"top"})
	checkDir(s, "a", []string{"a/sub"}, []string{"a/b"})
	checkDir(s, "a/sub", nil, []string{"a/sub/deep"})
	_, _, err = s.ListDir(ctx, "nope")
	wantErr(t, "ListDir of a missing namespace", err, leasecore.ErrNoNamespace)
	err = s.Rmdir(ctx, "a")
	wantErr(t, "Rmdir a holding namespace a/sub", err, leasecore.ErrNotEmpty)
	err = s.Rmdir(ctx, "nope")
	wantErr(t, "Rmdir of a missing namespace", err, leasecore.ErrNotFound)

	// Namespaces survive a reopen.
	s.Close()
	s2 := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
	if ns, err := s2.Namespace(ctx, "a"); err != nil || ns.UID != 1000 || ns.GID != 100 ||
		!ns.CreatedAt.Equal(testStart.Truncate(time.Millisecond)) {
		t.Fatalf("Namespace(a) after reopen = %+v, %v", ns, err)
	}
	checkDir(s2, "", []string{"a", "z"}, []string{"top"})
	checkDir(s2, "a", []string{"a/sub"}, []string{"a/b"})

	if err := s2.Rmdir(ctx, "z"); err != nil {
		t.Fatalf("Rmdir of an empty namespace: %v", err)
	}
	_, err = s2.Namespace(ctx, "z")
	wantErr(t, "Namespace(z) after Rmdir", err, leasecore.ErrNotFound)
	if _, err := s2.End(ctx, ab.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	err = s2.Rmdir(ctx, "a")
	wantErr(t, "Rmdir a with a/sub still there", err, leasecore.ErrNotEmpty)
}

// A namespace whose only lease has expired is empty (the dead lease is
// ended on access).
func TestRmdirWithExpiredLease(t *testing.T) {
	t.Parallel()
	s, clock, _ := newTestStore(t, Options{})
	ctx := context.Background()
	if _, err := s.Mkdir(ctx, "a", 0, 0); err != nil {
		t.Fatal(err)
	}
	g := reserve(t, s, "a/b")
	clock.Advance(leasecore.DefaultLeaseDuration)
	if err := s.Rmdir(ctx, "a"); err != nil {
		t.Fatalf("Rmdir with only an expired lease: %v", err)
	}
	if l, err := s.Load(ctx, g.Lease.ID); err != nil || l.Status != leasecore.StatusAbandoned {
		t.Fatalf("expired lease after Rmdir = %+v, %v", l, err)
	}
	// Mkdir over an expired lease works too.
	reserve(t, s, "x")
	clock.Advance(leasecore.DefaultLeaseDuration)
	if _, err := s.Mkdir(ctx, "x", 0, 0); err != nil {
		t.Fatalf("Mkdir over an expired lease: %v", err)
	}
}

func TestCorruptNamespacesFileIgnored(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	if err := os.WriteFile(filepath.Join(state, namespacesName), []byte(
		"[[namespace]]\npath = \"ok\"\nuid = 1\ngid = 1\ncreated_at = \"2026-11-30T02:00:00Z\"\n"+
			"[[namespace]]\npath = \"orphan/child\"\nuid = 1\ngid = 1\ncreated_at = \"2026-11-30T02:00:00Z\"\n"+
			"[[namespace]]\npath = \"../evil\"\nuid = 1\ngid = 1\ncreated_at = \"2026-11-30T02:00:00Z\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, state, Options{Options: leasecore.Options{Clock: clocktest.NewFakeClock(testStart)}})
	ctx := context.Background()
	if _, err := s.Namespace(ctx, "ok"); err != nil {
		t.Errorf("valid namespace: %v", err)
	}
	for _, p := range []string{"orphan/child", "../evil"} {
		if _, err := s.Namespace(ctx, p); err == nil {
			t.Errorf("invalid namespace %q loaded", p)
		}
	}
	s.Close()

	state2 := t.TempDir()
	if err := os.WriteFile(filepath.Join(state2, namespacesName), []byte("{{{ garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, state2, Options{Options: leasecore.Options{Clock: clocktest.NewFakeClock(testStart)}})
	reserve(t, s2, "x")
}
