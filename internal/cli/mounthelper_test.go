package cli

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/mount"
)

// isMountHelper recognises "SOURCE MOUNTPOINT [-o OPTIONS]" as mount.fuse3
// passes it, and leaves every command line of the commands to cobra.
func TestIsMountHelper(t *testing.T) {
	root := newRootCmd(io.Discard, io.Discard)
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"/var/lib/leasefs", "/mnt/leases", "-o", "rw,dev,suid"}, true},
		{[]string{"/var/lib/leasefs", "/mnt/leases"}, true},
		{[]string{"state", "/mnt/leases", "-o", "lease_duration=60s"}, true},
		{[]string{"state", "/mnt/leases", "-orw"}, true},
		{[]string{"./state", "/mnt/leases"}, true},
		{[]string{"moutn", "/mnt/leases"}, false}, // a mistyped command
		{[]string{"state", "/mnt/leases", "/x"}, false},
		{[]string{"mount", "/mnt/leases"}, false},
		{[]string{"ls", "/x"}, false},
		{[]string{"history", "/job"}, false},
		{[]string{"help", "/x"}, false},
		{[]string{"completion", "/x"}, false},
		{[]string{"__complete", "/x"}, false},
		{[]string{"--state", "/x"}, false},
		{[]string{"/var/lib/leasefs"}, false},
		{[]string{"/var/lib/leasefs", "relative"}, false},
		{[]string{"", "/mnt"}, false},
		{nil, false},
	} {
		if got := isMountHelper(root, tc.args); got != tc.want {
			t.Errorf("isMountHelper(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}

// parseMountHelper maps leasefs's -o options to "leasefs mount" flags,
// ignores the generic options mount(8) and mount.fuse3 pass, and refuses
// anything else as a usage error.
func TestParseMountHelper(t *testing.T) {
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		args  []string
		flags []string // nil: no flags
		err   string   // non-empty: a usage error containing it
	}{
		{name: "no options", args: []string{"/s", "/m"}},
		{name: "what mount.fuse3 passes", args: []string{"/s", "/m", "-o", "rw,allow_other,lease_duration=60s,dev,suid"},
			flags: []string{"--allow-other", "--lease-duration", "60s"}},
		{name: "every option", args: []string{"/s", "/m", "-o",
			"allow_other,lease_duration=90s,max_leases_per_uid=5,history_keep=7,takeover,takeover_timeout=30s,debug"},
			flags: []string{"--allow-other", "--lease-duration", "90s", "--max-leases-per-uid", "5", "--history-keep", "7",
				"--takeover", "--takeover-timeout", "30s", "--debug"}},
		{name: "generic options", args: []string{"/s", "/m", "-o",
			"rw,defaults,auto,noauto,nouser,_netdev,nofail,dev,nodev,suid,nosuid,exec,noexec,noatime,relatime,async,sync,x-systemd.requires=foo.service,x-systemd.automount,comment=x,,"}},
		{name: "-o twice and joined", args: []string{"/s", "/m", "-o", "allow_other", "-ohistory_keep=3"},
			flags: []string{"--allow-other", "--history-keep", "3"}},
		{name: "metrics and log format", args: []string{"/s", "/m", "-o", "metrics_addr=127.0.0.1:9090,log_format=json,pprof"},
			flags: []string{"--metrics-addr", "127.0.0.1:9090", "--log-format", "json", "--pprof"}},
		{name: "log level", args: []string{"/s", "/m", "-o", "log_level=warn"}, flags: []string{"--log-level", "warn"}},
		{name: "log level without a value", args: []string{"/s", "/m", "-o", "log_level"}, err: "needs a value"},
		{name: "an etcd store", args: []string{"/s", "/m", "-o", "rw,store=etcd://10.0.0.1:2379+10.0.0.2:2379/leasefs,etcd_grace=20s"},
			flags: []string{"--store", "etcd://10.0.0.1:2379,10.0.0.2:2379/leasefs", "--etcd-grace", "20s"}},
		{name: "unknown option", args: []string{"/s", "/m", "-o", "rw,colour=red"}, err: `unknown mount option "colour=red"`},
		{name: "unknown bare option", args: []string{"/s", "/m", "-o", "user_xattr"}, err: `unknown mount option "user_xattr"`},
		{name: "read-only", args: []string{"/s", "/m", "-o", "ro"}, err: "read-only"},
		{name: "missing value", args: []string{"/s", "/m", "-o", "lease_duration"}, err: "needs a value"},
		{name: "unexpected value", args: []string{"/s", "/m", "-o", "allow_other=1"}, err: "takes no value"},
		{name: "empty name", args: []string{"/s", "/m", "-o", "=60s"}, err: "unknown mount option"},
		{name: "extra argument", args: []string{"/s", "/m", "/other"}, err: `unexpected argument "/other"`},
		{name: "-o without options", args: []string{"/s", "/m", "-o"}, err: `unexpected argument "-o"`},
		{name: "another flag", args: []string{"/s", "/m", "-v"}, err: `unexpected argument "-v"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := parseMountHelper(tc.args)
			if tc.err != "" {
				var ue usageError
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.As(err, &ue) {
					t.Fatalf("parseMountHelper(%q) = %v, want a usage error containing %q", tc.args, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseMountHelper(%q): %v", tc.args, err)
			}
			if !slices.Equal(h.flags, tc.flags) {
				t.Errorf("flags %q, want %q", h.flags, tc.flags)
			}
			want := append(append([]string{"mount", "--state", "/s"}, tc.flags...), "/m")
			if got := h.mountArgs(); !slices.Equal(got, want) {
				t.Errorf("mountArgs() = %q, want %q", got, want)
			}
		})
	}
	// A relative source is the state directory below the working directory.
	h, err := parseMountHelper([]string{"state", "/m/", "-o", "rw"})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(cwd, "state"); h.state != want || h.mountpoint != "/m" {
		t.Errorf("state %q, mountpoint %q; want %q, /m", h.state, h.mountpoint, want)
	}
	// The wait for readiness covers a takeover.
	if h.readyTimeout != helperReadyTimeout+mount.DefaultTakeoverTimeout {
		t.Errorf("readyTimeout %s, want %s", h.readyTimeout, helperReadyTimeout+mount.DefaultTakeoverTimeout)
	}
	h, err = parseMountHelper([]string{"/s", "/m", "-o", "takeover,takeover_timeout=2m"})
	if err != nil {
		t.Fatal(err)
	}
	if want := helperReadyTimeout + 2*time.Minute; h.readyTimeout != want {
		t.Errorf("with takeover_timeout=2m: readyTimeout %s, want %s", h.readyTimeout, want)
	}
}

// Through run, a bad option exits 2 with a message and starts nothing; a
// mountpoint that does not exist exits 1 before anything is created.
func TestMountHelperErrors(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	r := runCLI(t, state, t.TempDir(), "-o", "rw,bogus")
	if r.code != exitUsage || !strings.Contains(r.stderr, `unknown mount option "bogus"`) {
		t.Errorf("unknown option: exit %d, stderr %q; want 2 naming it", r.code, r.stderr)
	}
	r = runCLI(t, state, filepath.Join(t.TempDir(), "missing"), "-o", "lease_duration=60s")
	if r.code != exitError {
		t.Errorf("missing mountpoint: exit %d, want %d; stderr %q", r.code, exitError, r.stderr)
	}
	wantUserMessage(t, r, "does not exist")
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("the failed helper created the state directory: %v", err)
	}
}
