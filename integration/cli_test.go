package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasefs/leasefs/internal/testenv"
)

// TestUnprivilegedMountExplained runs `leasefs mount` as uid 65534 on a mountpoint that only
// root may write. fusermount3 refuses it (for /dev/fuse when nobody may not open it, else for
// the mountpoint), and leasefs says which and what to do, not fusermount's exit status; it
// mounts nothing.
func TestUnprivilegedMountExplained(t *testing.T) {
	t.Parallel()
	testenv.RequireFUSE(t)
	setpriv := requireTool(t, "setpriv")
	requireTool(t, "fusermount3")
	asNobody := []string{setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups"}

	base := t.TempDir()
	// t.TempDir's per-test parent is 0700; nobody must be able to walk to base.
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mp := filepath.Join(base, "mp") // root's, 0755: nobody may not write it
	state := filepath.Join(base, "state")
	for _, d := range []string{mp, state} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(state, 65534, 65534); err != nil {
		t.Fatal(err)
	}

	// fusermount3 opens /dev/fuse with the caller's permissions before it checks the
	// mountpoint; ask the kernel which of the two refuses nobody.
	want := "cannot mount on " + mp + ": you have no write access to the mountpoint " + mp +
		"; fusermount3 mounts only on directories you may write"
	if r := runClient(t, nil, append(asNobody, "sh", "-c", "exec 3<>/dev/fuse")...); r.code != 0 {
		want = "cannot mount on " + mp + ": cannot open /dev/fuse: permission denied; make /dev/fuse readable and writable by you"
	}

	r := runClient(t, nil, append(asNobody, leasefsBin, "mount", "--state", state, mp)...)
	if r.code != 1 {
		t.Errorf("unprivileged mount: %s\nwant exit 1", r)
	}
	var line string
	for l := range strings.Lines(r.stderr) {
		if strings.HasPrefix(l, "leasefs: ") {
			line = l
		}
	}
	if !strings.Contains(line, want) {
		t.Errorf("unprivileged mount's message %q, want it to contain %q; stderr:\n%s", line, want, r.stderr)
	}
	for _, bad := range []string{"fusermount exited", "mount:", "leasecore:", "filestore:", "engine:"} {
		if strings.Contains(line, bad) {
			t.Errorf("unprivileged mount's message %q contains %q", line, bad)
		}
	}
	if n := mountCount(t, mp); n != 0 {
		t.Errorf("%d mounts on %s after the failed mount", n, mp)
		detach(t, mp)
	}
}

// TestLsPermissionDenied runs `leasefs ls` as uid 65534 on root's state directory (0700): the
// message says which store could not be read and why, without internal package names.
func TestLsPermissionDenied(t *testing.T) {
	fileStoreOnly(t, "the permissions of the state directory decide who may list")
	t.Parallel()
	testenv.RequireFUSE(t)
	setpriv := requireTool(t, "setpriv")
	d := startDaemon(t, daemonOpts{})
	reserve(t, filepath.Join(d.mountpoint, "kept"))
	// nobody may walk to the state directory (t.TempDir's directory and its per-test
	// parent are 0700), not into it.
	for _, p := range []string{filepath.Dir(filepath.Dir(d.state)), filepath.Dir(d.state)} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"ls"}, {"history", "--json"}} {
		argv := append([]string{setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups", leasefsBin},
			append(args, "--state", d.state)...)
		r := runClient(t, nil, argv...)
		want := "leasefs: cannot read the lease store in " + d.state + ": permission denied"
		if r.code != 1 || !strings.HasPrefix(r.stderr, want) || strings.Contains(r.stderr, "filestore:") || strings.Contains(r.stderr, "leasecore:") {
			t.Errorf("leasefs %s as nobody: %s\nwant exit 1 and a message starting %q", args, r, want)
		}
	}
}
