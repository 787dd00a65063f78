package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/mount"
)

// result is the outcome of one command line run by [runCLI].
type result struct {
	code           int
	stdout, stderr string
}

// runCLI runs the leasefs command line args in this process.
func runCLI(t *testing.T, args ...string) result {
	t.Helper()
	var stdout, stderr strings.Builder
	code := run(context.Background(), args, &stdout, &stderr)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// tree lists every path under dir, relative to it; nil when dir does not exist.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, rel)
		return nil
	})
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return out
}

// packageNames are package names that must not reach a user's message.
var packageNames = []string{"leasecore:", "mount:", "fusefs:"}

// wantUserMessage fails unless stderr is free of package names and contains every want.
func wantUserMessage(t *testing.T, r result, want ...string) {
	t.Helper()
	for _, p := range packageNames {
		if strings.Contains(r.stderr, p) {
			t.Errorf("stderr names the internal package %q:\n%s", p, r.stderr)
		}
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
		}
	}
}

// TestNeverServedStateIsEmpty runs ls and history on state directories that no daemon has
// served: each prints an empty table or [] and exits 0, says on stderr that no daemon serves
// the directory, and leaves it as it was.
func TestNeverServedStateIsEmpty(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T) string // returns the state directory
	}{
		{"missing", func(t *testing.T) string { return filepath.Join(t.TempDir(), "state") }},
		{"missing parent", func(t *testing.T) string { return filepath.Join(t.TempDir(), "a", "b", "state") }},
		{"empty", func(t *testing.T) string { return t.TempDir() }},
		{"without writer-leases", func(t *testing.T) string {
			d := t.TempDir()
			if err := os.WriteFile(filepath.Join(d, "notes"), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			return d
		}},
	}
	commands := []struct {
		args []string
		want string // stdout
	}{
		{[]string{"ls"}, "RESOURCE  MODE  UID  PID  GENERATION  AGE  EXPIRES IN\n"},
		{[]string{"ls", "--json"}, "[]\n"},
		{[]string{"history"}, "RESOURCE  STATUS  MODE  UID  GENERATION  STARTED  ENDED\n"},
		{[]string{"history", "--json"}, "[]\n"},
		{[]string{"history", "feature/a", "--json"}, "[]\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			state := c.setup(t)
			before := tree(t, state)
			for _, cmd := range commands {
				args := append(slices.Clone(cmd.args), "--state", state)
				r := runCLI(t, args...)
				note := "leasefs: no daemon serves " + state + ", given with --state; showing the records of its file store\n"
				if r.code != exitOK || r.stdout != cmd.want || r.stderr != note {
					t.Errorf("leasefs %s: exit %d, stdout %q, stderr %q; want exit 0, stdout %q, stderr %q",
						strings.Join(args, " "), r.code, r.stdout, r.stderr, cmd.want, note)
				}
			}
			if after := tree(t, state); !slices.Equal(before, after) {
				t.Errorf("reading the store changed %s: before %q, after %q", state, before, after)
			}
		})
	}
}

// TestLsUnreadableState runs ls on a state "directory" that is a regular file: the message
// says which store could not be read and why, without internal package names.
func TestLsUnreadableState(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(state, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"ls", "history"} {
		r := runCLI(t, cmd, "--state", state)
		if r.code != exitError {
			t.Errorf("leasefs %s on a file: exit %d, want %d; stderr:\n%s", cmd, r.code, exitError, r.stderr)
		}
		wantUserMessage(t, r, "leasefs: cannot read the lease store in "+state+": ", "not a directory")
	}
}

// TestLsServedState checks that ls still reads a store that a daemon has written.
func TestLsServedState(t *testing.T) {
	state := t.TempDir()
	s, err := leasecore.OpenFileStore(state, leasecore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(context.Background(), leasecore.Draft{Resource: "feature-a", HolderUID: 1000}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, "ls", "--state", state)
	if r.code != exitOK || !strings.Contains(r.stdout, "feature-a") {
		t.Errorf("ls: exit %d, stdout %q, stderr %q; want feature-a listed", r.code, r.stdout, r.stderr)
	}
}

// TestUsageErrors checks that command line mistakes exit 2 and point to the --help of the
// command that was mistyped.
func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"mount"}, []string{"missing MOUNTPOINT", "Run 'leasefs mount --help' for usage."}},
		{[]string{"mount", "a", "b"}, []string{"one MOUNTPOINT", "Run 'leasefs mount --help' for usage."}},
		{[]string{"mount", "--lease-duration", "1ms", "x"}, []string{"--lease-duration", "Run 'leasefs mount --help' for usage."}},
		{[]string{"mount", "--bogus", "x"}, []string{"--bogus", "Run 'leasefs mount --help' for usage."}},
		{[]string{"mount", "--metrics-addr", "9623", "x"}, []string{"--metrics-addr", "HOST:PORT", "Run 'leasefs mount --help' for usage."}},
		{[]string{"mount", "--pprof", "x"}, []string{"--pprof needs --metrics-addr", "Run 'leasefs mount --help' for usage."}},
		{[]string{"mount", "--etcd-grace", "5s", "x"}, []string{"--etcd-grace needs an etcd:// --store"}},
		{[]string{"mount", "--store", "etcd://127.0.0.1:2379/p", "--etcd-grace", "-1s", "x"}, []string{"--etcd-grace -1s: must be 0 (no grace period) or positive"}},
		{[]string{"ls", "extra"}, []string{"extra", "Run 'leasefs ls --help' for usage."}},
		{[]string{"history", "a", "b"}, []string{"Run 'leasefs history --help' for usage."}},
		{[]string{"frobnicate"}, []string{`unknown command "frobnicate"`, "Run 'leasefs --help' for usage."}},
		{[]string{"--bogus"}, []string{"--bogus", "Run 'leasefs --help' for usage."}},
		{[]string{"ls", "--state", ""}, []string{"--state is empty", "Run 'leasefs ls --help' for usage."}},
		{[]string{"history", "--state="}, []string{"--state is empty"}},
		{[]string{"status", "--state", ""}, []string{"--state is empty"}},
		{[]string{"mount", "--state", "", "x"}, []string{"--state is empty"}},
		{[]string{"lock", "--mount", "", "a", "--", "true"}, []string{"--mount is empty"}},
		{[]string{"lock", "a\xff", "--", "true"}, []string{"not valid UTF-8", "Run 'leasefs lock --help' for usage."}},
		{[]string{"lock", strings.Repeat("a", 256), "--", "true"}, []string{"name too long", "Run 'leasefs lock --help' for usage."}},
		{[]string{"mount", ""}, []string{"MOUNTPOINT is empty", "Run 'leasefs mount --help' for usage."}},
		{[]string{"ls", "--store="}, []string{"--store is empty"}},
		{[]string{"history", ""}, []string{"RESOURCE is empty", "Run 'leasefs history --help' for usage."}},
		{[]string{"completion", "tcsh"}, []string{`unknown shell "tcsh"`, "bash", "Run 'leasefs completion --help' for usage."}},
	}
	for _, c := range cases {
		r := runCLI(t, c.args...)
		if r.code != exitUsage {
			t.Errorf("leasefs %s: exit %d, want %d; stderr:\n%s", strings.Join(c.args, " "), r.code, exitUsage, r.stderr)
		}
		wantUserMessage(t, r, c.want...)
	}
}

// TestNoArgsPrintsHelp checks that plain "leasefs" still prints its help and exits 0.
func TestNoArgsPrintsHelp(t *testing.T) {
	r := runCLI(t)
	if r.code != exitOK || !strings.Contains(r.stdout, "Available Commands") {
		t.Errorf("leasefs: exit %d, stdout %q, stderr %q; want help and exit 0", r.code, r.stdout, r.stderr)
	}
}

// TestMountBadMountpoint mounts on a missing path and on a regular file: the message names
// the mountpoint, and nothing is created in the state directory.
func TestMountBadMountpoint(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		mp, want string
	}{
		{filepath.Join(dir, "missing"), "leasefs: mountpoint " + filepath.Join(dir, "missing") + " does not exist"},
		{file, "leasefs: mountpoint " + file + " is not a directory"},
	}
	for _, c := range cases {
		state := filepath.Join(t.TempDir(), "state")
		r := runCLI(t, "mount", "--state", state, c.mp)
		if r.code != exitError {
			t.Errorf("mount %s: exit %d, want %d; stderr:\n%s", c.mp, r.code, exitError, r.stderr)
		}
		wantUserMessage(t, r, c.want)
		if got := tree(t, state); got != nil {
			t.Errorf("mount %s created the state directory: %q", c.mp, got)
		}
	}
}

// TestMountStateServed mounts on a state directory whose daemon lock another holder (this
// test process) has: exit 3, and the message names the holder without package names.
func TestMountStateServed(t *testing.T) {
	state := t.TempDir()
	lock, err := daemonlock.Acquire(filepath.Join(state, mount.DaemonLockName),
		daemonlock.CurrentHolder("leasefs mount /somewhere"))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	r := runCLI(t, "mount", "--state", state, t.TempDir())
	if r.code != exitHeld {
		t.Errorf("mount on a held state: exit %d, want %d; stderr:\n%s", r.code, exitHeld, r.stderr)
	}
	wantUserMessage(t, r, "leasefs: state directory "+state+" is held by leasefs mount /somewhere (pid ")
}
