package cli

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/mount"
)

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

// TestMountHelpKeepsHandleLeases: the help of mount says what SIGTERM does to handle leases
// as docs/PROTOCOL.md §2, "Handle leases across restarts", does: they outlive the daemon.
func TestMountHelpKeepsHandleLeases(t *testing.T) {
	r := runCLI(t, "mount", "--help")
	if r.code != exitOK {
		t.Fatalf("leasefs mount --help: %+v", r)
	}
	help := strings.Join(strings.Fields(r.stdout), " ")
	if strings.Contains(help, "handle leases end with the mount") {
		t.Errorf("leasefs mount --help says handle leases end with the mount:\n%s", r.stdout)
	}
	for _, want := range []string{"a handle lease lives on while a process still holds the open file", "the next daemon of the state directory keeps it", "Handle leases across restarts"} {
		if !strings.Contains(help, want) {
			t.Errorf("leasefs mount --help lacks %q:\n%s", want, r.stdout)
		}
	}
}

// TestMountLogLevel checks --log-level: its four levels, --debug as its
// alias, and a bad value or a contradiction as a usage error (exit 2)
// before anything is created.
func TestMountLogLevel(t *testing.T) {
	for name, want := range map[string]slog.Level{
		"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError, "WARN": slog.LevelWarn,
	} {
		if got, err := parseLogLevel(name); err != nil || got != want {
			t.Errorf("parseLogLevel(%q) = %v, %v; want %v", name, got, err, want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--log-level", "verbose"}, `leasefs: --log-level "verbose": want debug, info, warn or error`},
		{[]string{"--log-level", ""}, `leasefs: --log-level "": want debug, info, warn or error`},
		{[]string{"--debug", "--log-level", "warn"}, "leasefs: --debug is --log-level debug; it contradicts --log-level warn"},
	} {
		state := filepath.Join(t.TempDir(), "state")
		r := runCLI(t, append(append([]string{"mount", "--state", state}, tc.args...), t.TempDir())...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("mount %q: exit %d, stderr:\n%s\nwant exit %d and %q", tc.args, r.code, r.stderr, exitUsage, tc.want)
		}
		if got := tree(t, state); got != nil {
			t.Errorf("mount %q created the state directory: %q", tc.args, got)
		}
	}
}
