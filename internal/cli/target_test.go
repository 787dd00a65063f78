package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/internal/procfs"
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

func leasefsMount(point, state string) procfs.MountInfo {
	return procfs.MountInfo{Point: point, FSType: "fuse.leasefs", Source: state}
}

// TestPickTargetPrecedence checks the one order of docs/PROTOCOL.md §8, "Which daemon": the
// flags (--state, --mount), then the environment ($LEASEFS_STATE, $LEASEFS_MOUNT), then the one
// leasefs mount up (stale mounts and other filesystems left out) or, for an etcd --store, the
// mount up serving it, then the default state directory.
func TestPickTargetPrecedence(t *testing.T) {
	up := serveState(t, "/mnt/up", "")
	etcd := serveState(t, "/mnt/etcd", "etcd://127.0.0.1:2379/leases")
	stale := staleState(t, "/mnt/stale")
	flagged := t.TempDir()
	env := serveState(t, "/mnt/env", "")
	other := procfs.MountInfo{Point: "/data", FSType: "ext4", Source: "/dev/vda"}
	oneUp := []procfs.MountInfo{other, leasefsMount("/mnt/stale", stale), leasefsMount("/mnt/up", up)}
	twoUp := append(oneUp, leasefsMount("/mnt/etcd", etcd))

	cases := []struct {
		name                 string
		state, mnt, store    string // flags
		stateEnv, mountEnv   string
		mounts               []procfs.MountInfo
		wantState, wantMount string
		wantServed           bool
		wantFrom             string
		wantHolding          string // the store the lock records
	}{
		{"--state over both variables", flagged, "", "", env, "/mnt/etcd", twoUp, flagged, "", false, fromStateFlag, ""},
		{"--mount over both variables", "", "/mnt/etcd", "", up, "/mnt/up", twoUp, etcd, "/mnt/etcd", true, fromMountFlag, "etcd://127.0.0.1:2379/leases"},
		{"--mount of a stale mount", "", "/mnt/stale", "", "", "", twoUp, stale, "/mnt/stale", false, fromMountFlag, ""},
		{"$LEASEFS_STATE over discovery", "", "", "", env, "", twoUp, env, "/mnt/env", true, fromStateEnv, ""},
		{"$LEASEFS_MOUNT over discovery", "", "", "", "", "/mnt/etcd", twoUp, etcd, "/mnt/etcd", true, fromMountEnv, "etcd://127.0.0.1:2379/leases"},
		{"$LEASEFS_MOUNT of a stale mount", "", "", "", "", "/mnt/stale", twoUp, stale, "/mnt/stale", false, fromMountEnv, ""},
		{"both variables agreeing", "", "", "", up, "/mnt/up", twoUp, up, "/mnt/up", true, fromStateEnv, ""},
		{"both variables, no leasefs mount on $LEASEFS_MOUNT", "", "", "", flagged, "/nowhere", twoUp, flagged, "", false, fromStateEnv, ""},
		{"$LEASEFS_MOUNT over an etcd --store", "", "", "etcd://127.0.0.1:2379/leases", "", "/mnt/up", twoUp, up, "/mnt/up", true, fromMountEnv, ""},
		{"the one mount up", "", "", "", "", "", oneUp, up, "/mnt/up", true, fromMountUp, ""},
		{"the one etcd mount up", "", "", "", "", "", []procfs.MountInfo{leasefsMount("/mnt/etcd", etcd)}, etcd, "/mnt/etcd", true, fromMountUp, "etcd://127.0.0.1:2379/leases"},
		{"the mount up serving --store", "", "", "etcd://127.0.0.1:2379/leases", "", "", twoUp, etcd, "/mnt/etcd", true, fromStoreUp, "etcd://127.0.0.1:2379/leases"},
		{"none up serving --store: the default", "", "", "etcd://127.0.0.1:2379/other", "", "", twoUp, mount.DefaultStateDir(), "", false, fromDefault, ""},
		{"none up: the default", "", "", "", "", "", []procfs.MountInfo{other, leasefsMount("/mnt/stale", stale)}, mount.DefaultStateDir(), "", false, fromDefault, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("LEASEFS_STATE", c.stateEnv)
			t.Setenv("LEASEFS_MOUNT", c.mountEnv)
			got, err := pickTarget(c.state, c.mnt, c.store, c.mounts)
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
// mountpoint and state directory; so are --state with --mount, a --mount or a lone
// $LEASEFS_MOUNT that is not a leasefs mount, and $LEASEFS_STATE and $LEASEFS_MOUNT naming
// different daemons.
func TestPickTargetUsageErrors(t *testing.T) {
	t.Setenv("LEASEFS_STATE", "")
	t.Setenv("LEASEFS_MOUNT", "")
	a := serveState(t, "/mnt/a", "")
	b := serveState(t, "/mnt/b", "etcd://10.0.0.1:2379/x")
	mounts := []procfs.MountInfo{
		leasefsMount("/mnt/a", a),
		leasefsMount("/mnt/b", b),
		leasefsMount("/mnt/b2", b), // a second mount of the same state is the same daemon
		{Point: "/data", FSType: "ext4", Source: "/dev/vda"},
	}
	_, err := pickTarget("", "", "", mounts)
	var ue usageError
	if !errors.As(err, &ue) {
		t.Fatalf("two mounts up: %v, want a usage error", err)
	}
	for _, want := range []string{"2 leasefs mounts are up", "/mnt/a  (state " + a + ")", "/mnt/b  (state " + b + ", store etcd://10.0.0.1:2379/x)", "--mount DIR", "LEASEFS_MOUNT"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("two mounts up: %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "/mnt/b2") {
		t.Errorf("two mounts up: %q lists the daemon's second mount instead of its recorded one", err)
	}
	for _, c := range []struct{ state, mnt, stateEnv, mountEnv, want string }{
		{a, "/mnt/a", "", "", "not both"},
		{"", "/data", "", "", "--mount /data: not a leasefs mount"},
		{"", "/nowhere", "", "", "--mount /nowhere: not a leasefs mount"},
		{"", "", "", "/data", "$LEASEFS_MOUNT /data: not a leasefs mount"},
		{"", "", a, "/mnt/b", "$LEASEFS_STATE " + a + " and $LEASEFS_MOUNT /mnt/b name different daemons"},
	} {
		t.Setenv("LEASEFS_STATE", c.stateEnv)
		t.Setenv("LEASEFS_MOUNT", c.mountEnv)
		if _, err := pickTarget(c.state, c.mnt, "", mounts); !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("pickTarget(%q, %q) with LEASEFS_STATE=%q LEASEFS_MOUNT=%q: %v, want a usage error with %q",
				c.state, c.mnt, c.stateEnv, c.mountEnv, err, c.want)
		}
	}
}

// TestLockMountFollowsDiscovery: lock's mount is that of the daemon pickTarget chooses: the
// leasefs mount --mount or $LEASEFS_MOUNT names, else the mountpoint $LEASEFS_STATE's daemon
// (or the one up) records; a state nobody serves is a usage error naming it.
func TestLockMountFollowsDiscovery(t *testing.T) {
	served := serveState(t, "/mnt/served", "")
	other := serveState(t, "/mnt/other", "")
	mounts := []procfs.MountInfo{leasefsMount("/mnt/served", served), leasefsMount("/mnt/other", other)}
	t.Setenv("LEASEFS_MOUNT", "")
	t.Setenv("LEASEFS_STATE", served)
	if got, err := lockMount("", mounts); err != nil || got != "/mnt/served" {
		t.Errorf("lockMount with LEASEFS_STATE served: %q, %v; want /mnt/served", got, err)
	}
	if got, err := lockMount("/mnt/other", mounts); err != nil || got != "/mnt/other" {
		t.Errorf("lockMount(--mount) over LEASEFS_STATE: %q, %v; want /mnt/other", got, err)
	}
	t.Setenv("LEASEFS_STATE", "")
	t.Setenv("LEASEFS_MOUNT", "/mnt/other")
	if got, err := lockMount("", mounts); err != nil || got != "/mnt/other" {
		t.Errorf("lockMount with LEASEFS_MOUNT: %q, %v; want /mnt/other", got, err)
	}
	t.Setenv("LEASEFS_MOUNT", "")
	var ue usageError
	if _, err := lockMount("", mounts); !errors.As(err, &ue) || !strings.Contains(err.Error(), "2 leasefs mounts are up") {
		t.Errorf("lockMount with two mounts up and none named: %v, want the usage error listing them", err)
	}
	idle := t.TempDir()
	t.Setenv("LEASEFS_STATE", idle)
	_, err := lockMount("", mounts)
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "no daemon serves "+idle+", named by $LEASEFS_STATE") {
		t.Errorf("lockMount with LEASEFS_STATE unserved: %v, want a usage error naming it", err)
	}
}

// TestEveryCommandHonoursLeasefsMount: ls, history and status, like lock, read the daemon that
// $LEASEFS_MOUNT names; one that names no leasefs mount is a usage error of each.
func TestEveryCommandHonoursLeasefsMount(t *testing.T) {
	t.Setenv("LEASEFS_STATE", "")
	t.Setenv("LEASEFS_MOUNT", t.TempDir())
	for _, cmd := range []string{"ls", "history", "status"} {
		r := runCLI(t, cmd)
		if r.code != exitUsage || !strings.Contains(r.stderr, "$LEASEFS_MOUNT "+os.Getenv("LEASEFS_MOUNT")+": not a leasefs mount") {
			t.Errorf("leasefs %s with LEASEFS_MOUNT on a plain directory: %+v, want exit 2 naming it", cmd, r)
		}
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
	t.Setenv("LEASEFS_MOUNT", "")
	t.Setenv("LEASEFS_STATE", t.TempDir())
	r := runCLI(t, "ls")
	if r.code != exitOK || !strings.Contains(r.stderr, "no daemon serves "+os.Getenv("LEASEFS_STATE")+", named by $LEASEFS_STATE; showing the records of its file store") {
		t.Errorf("leasefs ls with an unserved $LEASEFS_STATE: %+v, want exit 0 and the note", r)
	}
}
