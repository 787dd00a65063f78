package integration

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasefs/leasefs/etcdstore/etcdtest"
)

// Which daemon the commands read (docs/PROTOCOL.md §8, "Which daemon"): --state, --mount,
// $LEASEFS_STATE, the one leasefs mount up, the default state directory.

// onlyMountsScript runs "$@" in the mount namespace of its own that unshare(1) gave it, after
// lazily detaching there every leasefs mount whose mountpoint is not in $KEEP (one per line):
// other tests' daemons are up on this machine too. Nothing is detached outside it.
const onlyMountsScript = `
awk '{ for (i = 7; i <= NF; i++) if ($i == "-") { if ($(i+1) == "fuse.leasefs") print $5; break } }' /proc/self/mountinfo |
while IFS= read -r m; do
	if ! printf '%s\n' "$KEEP" | grep -qxF -- "$m"; then
		umount -i -l "$m" 2>/dev/null || true
	fi
done
exec "$@"
`

// leasefsAmong runs `leasefs args…` where the only leasefs mounts up are those on keep (see
// [onlyMountsScript]), with env added to an environment that names no state directory or
// mount. Unlike [runClient] it adds no --store: the command finds the store itself.
func leasefsAmong(t testing.TB, keep []string, env []string, args ...string) result {
	t.Helper()
	unshare := requireTool(t, "unshare")
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	argv := append([]string{"--mount", "--propagation", "private", "sh", "-c", onlyMountsScript, "sh", leasefsBin}, args...)
	cmd := exec.CommandContext(ctx, unshare, argv...)
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), "LEASEFS_STATE=", "LEASEFS_MOUNT=", "KEEP="+strings.Join(keep, "\n"))
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String(), code: -1}
	if cmd.ProcessState != nil {
		r.code = cmd.ProcessState.ExitCode()
	}
	var exitErr *exec.ExitError
	if ctx.Err() != nil || err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("leasefs %q: %v (%v): %s", args, err, ctx.Err(), r)
	}
	return r
}

// TestCLIFollowsTheDaemon: with one daemon up, `leasefs ls`, `history`, `status` and `lock`
// without flags use it; with two up and none named, ls, history and status exit 2 listing
// both; $LEASEFS_STATE and --mount pick one; a state directory nobody serves is listed with
// a note on stderr.
func TestCLIFollowsTheDaemon(t *testing.T) {
	t.Parallel()
	requireTool(t, "umount")
	d1 := startDaemon(t, daemonOpts{})
	reserve(t, filepath.Join(d1.mountpoint, "first"))
	mustSh(t, `set -C; : > "$M/gone" && rm "$M/gone"`, "M="+d1.mountpoint)

	one := []string{d1.mountpoint}
	r := leasefsAmong(t, one, nil, "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "first") || r.stderr != "" {
		t.Errorf("ls with one daemon up: %s\nwant exit 0 listing first, no stderr", r)
	}
	if r := leasefsAmong(t, one, nil, "history"); r.code != 0 || !strings.Contains(r.stdout, "gone") || r.stderr != "" {
		t.Errorf("history with one daemon up: %s\nwant exit 0 listing gone", r)
	}
	if r := leasefsAmong(t, one, nil, "status"); r.code != 0 || !strings.Contains(r.stdout, "mountpoint:  "+d1.mountpoint) {
		t.Errorf("status with one daemon up: %s\nwant exit 0 naming %s", r, d1.mountpoint)
	}
	if r := leasefsAmong(t, one, nil, "lock", "-n", "job", "--", "sh", "-c", `echo "gen $LEASEFS_GENERATION"`); r.code != 0 || !strings.Contains(r.stdout, "gen ") {
		t.Errorf("lock with one daemon up: %s\nwant exit 0 and the command run", r)
	}

	d2 := startDaemon(t, daemonOpts{})
	reserve(t, filepath.Join(d2.mountpoint, "second"))
	both := []string{d1.mountpoint, d2.mountpoint}
	// The namespace of leasefsAmong hides the mounts it is not told to keep.
	if r := leasefsAmong(t, one, nil, "ls"); r.code != 0 || !strings.Contains(r.stdout, "first") || strings.Contains(r.stdout, "second") {
		t.Errorf("ls with the second daemon's mount hidden: %s\nwant the first daemon's leases only", r)
	}
	for _, args := range [][]string{{"ls"}, {"history", "--json"}, {"status"}} {
		r := leasefsAmong(t, both, nil, args...)
		if r.code != 2 || r.stdout != "" {
			t.Errorf("%s with two daemons up: %s\nwant exit 2 and nothing listed", args, r)
		}
		for _, want := range []string{"2 leasefs mounts are up", d1.mountpoint + "  (state " + d1.state, d2.mountpoint + "  (state " + d2.state, "--mount DIR"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("%s with two daemons up: stderr lacks %q:\n%s", args, want, r.stderr)
			}
		}
	}
	r = leasefsAmong(t, both, []string{"LEASEFS_STATE=" + d2.state}, "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "second") || strings.Contains(r.stdout, "first") || r.stderr != "" {
		t.Errorf("ls with LEASEFS_STATE naming the second daemon: %s\nwant its leases only", r)
	}
	// $LEASEFS_MOUNT picks a daemon for every command, as $LEASEFS_STATE does.
	r = leasefsAmong(t, both, []string{"LEASEFS_MOUNT=" + d2.mountpoint}, "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "second") || strings.Contains(r.stdout, "first") || r.stderr != "" {
		t.Errorf("ls with LEASEFS_MOUNT naming the second daemon: %s\nwant its leases only", r)
	}
	if r := leasefsAmong(t, both, []string{"LEASEFS_MOUNT=" + d2.mountpoint}, "status"); r.code != 0 || !strings.Contains(r.stdout, "mountpoint:  "+d2.mountpoint) {
		t.Errorf("status with LEASEFS_MOUNT naming the second daemon: %s\nwant exit 0 naming %s", r, d2.mountpoint)
	}
	if r := leasefsAmong(t, both, []string{"LEASEFS_MOUNT=" + d2.mountpoint, "LEASEFS_STATE=" + d1.state}, "ls"); r.code != 2 || !strings.Contains(r.stderr, "name different daemons") {
		t.Errorf("ls with LEASEFS_STATE and LEASEFS_MOUNT naming different daemons: %s\nwant exit 2", r)
	}
	r = leasefsAmong(t, both, []string{"LEASEFS_STATE=" + d2.state}, "ls", "--mount", d1.mountpoint)
	if r.code != 0 || !strings.Contains(r.stdout, "first") || strings.Contains(r.stdout, "second") {
		t.Errorf("ls --mount of the first daemon: %s\nwant its leases only", r)
	}
	if r := leasefsAmong(t, both, nil, "ls", "--mount", t.TempDir()); r.code != 2 || !strings.Contains(r.stderr, "not a leasefs mount") {
		t.Errorf("ls --mount of a plain directory: %s\nwant exit 2, not a leasefs mount", r)
	}

	idle := t.TempDir()
	r = leasefsAmong(t, both, nil, "ls", "--state", idle)
	if want := "leasefs: no daemon serves " + idle + ", given with --state; showing the records of its file store\n"; r.code != 0 || r.stderr != want {
		t.Errorf("ls --state of a state nobody serves: %s\nwant exit 0 and stderr %q", r, want)
	}
	if etcdPass() {
		return // a stopped daemon's leases are in etcd, not in its state directory
	}
	d1.stop(true)
	r = leasefsAmong(t, []string{d2.mountpoint}, nil, "ls", "--json", "--state", d1.state)
	if r.code != 0 || !strings.Contains(r.stdout, `"first"`) || !strings.Contains(r.stderr, "no daemon serves "+d1.state) {
		t.Errorf("ls --state of a stopped daemon's state: %s\nwant its token lease listed and the note on stderr", r)
	}
}

// TestCLIReadsAnEtcdDaemon: `ls --state DIR` and `ls --mount DIR` of a daemon serving an
// etcd store read that store, as its lock records it, without --store; so do history and
// status.
func TestCLIReadsAnEtcdDaemon(t *testing.T) {
	t.Parallel()
	requireTool(t, "umount")
	srv := etcdtest.Start(t)
	d := startDaemon(t, daemonOpts{extraArgs: []string{"--store", "etcd://" + srv.Endpoint() + "/cli-follows"}})
	reserve(t, filepath.Join(d.mountpoint, "in-etcd"))
	mustSh(t, `set -C; : > "$M/ended" && rm "$M/ended"`, "M="+d.mountpoint)
	keep := []string{d.mountpoint}

	for _, args := range [][]string{{"ls", "--state", d.state}, {"ls", "--mount", d.mountpoint}, {"ls"}, {"ls", "--json", "--state", d.state}} {
		r := leasefsAmong(t, keep, nil, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "in-etcd") || r.stderr != "" {
			t.Errorf("leasefs %s of an etcd daemon: %s\nwant exit 0 listing in-etcd, no stderr", args, r)
		}
	}
	if r := leasefsAmong(t, keep, nil, "history", "--mount", d.mountpoint); r.code != 0 || !strings.Contains(r.stdout, "ended") {
		t.Errorf("history --mount of an etcd daemon: %s\nwant exit 0 listing ended", r)
	}
	r := leasefsAmong(t, keep, nil, "status", "--mount", d.mountpoint)
	if r.code != 0 || !strings.Contains(r.stdout, "etcd://"+srv.Endpoint()+"/cli-follows") || !strings.Contains(r.stdout, "leases:      1 token") {
		t.Errorf("status --mount of an etcd daemon: %s\nwant exit 0, its store and 1 token lease", r)
	}
}
