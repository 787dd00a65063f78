package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/mount"
)

// serveState makes this process the daemon of a new state directory: it
// holds the directory's real daemon lock, recording mountpoint and store,
// until the test ends. It returns the state directory.
func serveState(t *testing.T, mountpoint, store string) string {
	t.Helper()
	state := t.TempDir()
	h := daemonlock.CurrentHolder("leasefs mount " + mountpoint)
	h.Mountpoint, h.Store = mountpoint, store
	l, err := daemonlock.Acquire(filepath.Join(state, mount.DaemonLockName), h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Release() })
	return state
}

// staleState returns a state directory whose daemon died: its lock file
// and record are there, the lock is not held.
func staleState(t *testing.T, mountpoint string) string {
	t.Helper()
	state := t.TempDir()
	h := daemonlock.CurrentHolder("leasefs mount " + mountpoint)
	h.Mountpoint = mountpoint
	l, err := daemonlock.Acquire(filepath.Join(state, mount.DaemonLockName), h)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	return state
}

func leasefsMount(point, state string) mount.MountInfo {
	return mount.MountInfo{Point: point, FSType: "fuse.leasefs", Source: state}
}

// TestPickTargetPrecedence checks the order of docs/PROTOCOL.md §8, "Which daemon": --state,
// --mount, $LEASEFS_STATE, the one leasefs mount up (stale mounts and other filesystems left
// out), the default state directory.
func TestPickTargetPrecedence(t *testing.T) {
	t.Setenv("LEASEFS_STATE", "")
	up := serveState(t, "/mnt/up", "")
	etcd := serveState(t, "/mnt/etcd", "etcd://127.0.0.1:2379/leases")
	stale := staleState(t, "/mnt/stale")
	flagged := t.TempDir()
	env := serveState(t, "/mnt/env", "")
	other := mount.MountInfo{Point: "/data", FSType: "ext4", Source: "/dev/vda"}
	oneUp := []mount.MountInfo{other, leasefsMount("/mnt/stale", stale), leasefsMount("/mnt/up", up)}
	twoUp := append(oneUp, leasefsMount("/mnt/etcd", etcd))

	cases := []struct {
		name        string
		state, mnt  string
		env         string
		mounts      []mount.MountInfo
		wantState   string
		wantMount   string
		wantServed  bool
		wantFrom    string
		wantHolding string // the store the lock records
	}{
		{"--state wins", flagged, "", env, twoUp, flagged, "", false, fromStateFlag, ""},
		{"--mount names its source", "", "/mnt/etcd", env, twoUp, etcd, "/mnt/etcd", true, fromMountFlag, "etcd://127.0.0.1:2379/leases"},
		{"--mount of a stale mount", "", "/mnt/stale", "", twoUp, stale, "/mnt/stale", false, fromMountFlag, ""},
		{"$LEASEFS_STATE over discovery", "", "", env, twoUp, env, "/mnt/env", true, fromStateEnv, ""},
		{"the one mount up", "", "", "", oneUp, up, "/mnt/up", true, fromMountUp, ""},
		{"the one etcd mount up", "", "", "", []mount.MountInfo{leasefsMount("/mnt/etcd", etcd)}, etcd, "/mnt/etcd", true, fromMountUp, "etcd://127.0.0.1:2379/leases"},
		{"none up: the default", "", "", "", []mount.MountInfo{other, leasefsMount("/mnt/stale", stale)}, mount.DefaultStateDir(), "", false, fromDefault, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("LEASEFS_STATE", c.env)
			got, err := pickTarget(c.state, c.mnt, c.mounts)
			if err != nil {
				t.Fatalf("pickTarget: %v", err)
			}
			want, _ := filepath.Abs(c.wantState)
			if got.State != want || got.Mountpoint != c.wantMount || got.Served != c.wantServed || got.From != c.wantFrom || got.Holder.Store != c.wantHolding {
				t.Errorf("pickTarget = %+v\nwant state %s, mountpoint %q, served %v, from %q, store %q",
					got, want, c.wantMount, c.wantServed, c.wantFrom, c.wantHolding)
			}
		})
	}
}

// TestPickTargetUsageErrors: several mounts up and none named is a usage error listing each
// mountpoint and state directory; so are --state with --mount, and a --mount that is not a
// leasefs mount.
func TestPickTargetUsageErrors(t *testing.T) {
	t.Setenv("LEASEFS_STATE", "")
	a := serveState(t, "/mnt/a", "")
	b := serveState(t, "/mnt/b", "etcd://10.0.0.1:2379/x")
	mounts := []mount.MountInfo{
		leasefsMount("/mnt/a", a),
		leasefsMount("/mnt/b", b),
		leasefsMount("/mnt/b2", b), // a second mount of the same state is the same daemon
		{Point: "/data", FSType: "ext4", Source: "/dev/vda"},
	}
	_, err := pickTarget("", "", mounts)
	var ue usageError
	if !errors.As(err, &ue) {
		t.Fatalf("two mounts up: %v, want a usage error", err)
	}
	for _, want := range []string{"2 leasefs mounts are up", "/mnt/a  (state " + a + ")", "/mnt/b  (state " + b + ", store etcd://10.0.0.1:2379/x)", "--mount DIR"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("two mounts up: %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "/mnt/b2") {
		t.Errorf("two mounts up: %q lists the daemon's second mount instead of its recorded one", err)
	}
	for _, c := range []struct{ state, mnt, want string }{
		{a, "/mnt/a", "not both"},
		{"", "/data", "--mount /data: not a leasefs mount"},
		{"", "/nowhere", "--mount /nowhere: not a leasefs mount"},
	} {
		if _, err := pickTarget(c.state, c.mnt, mounts); !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("pickTarget(%q, %q): %v, want a usage error with %q", c.state, c.mnt, err, c.want)
		}
	}
}

// TestLockMountFollowsDiscovery: lock's mount is --mount, else $LEASEFS_MOUNT, else the
// mountpoint of $LEASEFS_STATE's daemon; a state nobody serves is a usage error naming it.
func TestLockMountFollowsDiscovery(t *testing.T) {
	served := serveState(t, "/mnt/served", "")
	t.Setenv("LEASEFS_MOUNT", "")
	t.Setenv("LEASEFS_STATE", served)
	if got, err := lockMount(""); err != nil || got != "/mnt/served" {
		t.Errorf("lockMount with LEASEFS_STATE served: %q, %v; want /mnt/served", got, err)
	}
	if got, err := lockMount("/mnt/flag"); err != nil || got != "/mnt/flag" {
		t.Errorf("lockMount(--mount): %q, %v", got, err)
	}
	t.Setenv("LEASEFS_MOUNT", "/mnt/env")
	if got, err := lockMount(""); err != nil || got != "/mnt/env" {
		t.Errorf("lockMount with LEASEFS_MOUNT: %q, %v", got, err)
	}
	t.Setenv("LEASEFS_MOUNT", "")
	idle := t.TempDir()
	t.Setenv("LEASEFS_STATE", idle)
	_, err := lockMount("")
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "no daemon serves "+idle+", named by $LEASEFS_STATE") {
		t.Errorf("lockMount with LEASEFS_STATE unserved: %v, want a usage error naming it", err)
	}
}

// TestLsSaysNobodyServes: ls and history of a store a daemon serves print no note; of one
// nobody serves, the note on stderr, the records on stdout.
func TestLsSaysNobodyServes(t *testing.T) {
	served := serveState(t, "/mnt/served", "")
	if err := os.MkdirAll(served, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"ls", "--state", served}, {"history", "--state", served}} {
		if r := runCLI(t, args...); r.code != exitOK || r.stderr != "" {
			t.Errorf("leasefs %q of a served state: %+v, want exit 0 and no stderr", args, r)
		}
	}
	t.Setenv("LEASEFS_STATE", t.TempDir())
	r := runCLI(t, "ls")
	if r.code != exitOK || !strings.Contains(r.stderr, "no daemon serves "+os.Getenv("LEASEFS_STATE")+", named by $LEASEFS_STATE; showing the records of its file store") {
		t.Errorf("leasefs ls with an unserved $LEASEFS_STATE: %+v, want exit 0 and the note", r)
	}
}
