package mount

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeFusermount writes an executable named fusermount3 into dir, setuid root when setuid
// (which needs root: the test skips otherwise), and returns its path.
func fakeFusermount(t *testing.T, dir string, setuid bool) string {
	t.Helper()
	p := filepath.Join(dir, "fusermount3")
	if err := os.WriteFile(p, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if setuid {
		if os.Geteuid() != 0 {
			t.Skip("a setuid-root fake fusermount3 needs root")
		}
		if err := os.Chmod(p, os.ModeSetuid|0o755); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func TestFusermountDiagnosis(t *testing.T) {
	notFound := func(string) (string, error) { return "", errors.New("not found") }
	cases := []struct {
		name       string
		allowOther bool
		setup      func(t *testing.T, dir string) fuseSystem
		wantReason string // "" for none found
		wantHint   string // a substring of the hint
	}{
		{"no fusermount3", false, func(t *testing.T, dir string) fuseSystem {
			return fuseSystem{device: filepath.Join(dir, "fuse"), conf: filepath.Join(dir, "fuse.conf"), lookPath: notFound}
		}, "fusermount3 is not installed", "install the fuse3 package"},
		{"fusermount3 not setuid", false, func(t *testing.T, dir string) fuseSystem {
			bin := fakeFusermount(t, dir, false)
			return fuseSystem{device: filepath.Join(dir, "fuse"), lookPath: func(string) (string, error) { return bin, nil }}
		}, "is not setuid root", "reinstall fuse3"},
		{"no device", false, func(t *testing.T, dir string) fuseSystem {
			bin := fakeFusermount(t, dir, true)
			return fuseSystem{device: filepath.Join(dir, "fuse"), lookPath: func(string) (string, error) { return bin, nil }}
		}, "/fuse does not exist", "modprobe fuse"},
		{"allow-other without user_allow_other", true, func(t *testing.T, dir string) fuseSystem {
			bin := fakeFusermount(t, dir, true)
			conf := writeFile(t, dir, "fuse.conf", "# user_allow_other\nmount_max = 1000\n")
			return fuseSystem{device: writeFile(t, dir, "fuse", ""), conf: conf, lookPath: func(string) (string, error) { return bin, nil }}
		}, "--allow-other needs user_allow_other in ", "add the line user_allow_other"},
		{"allow-other without fuse.conf", true, func(t *testing.T, dir string) fuseSystem {
			bin := fakeFusermount(t, dir, true)
			return fuseSystem{device: writeFile(t, dir, "fuse", ""), conf: filepath.Join(dir, "missing.conf"), lookPath: func(string) (string, error) { return bin, nil }}
		}, "--allow-other needs user_allow_other in ", "add the line user_allow_other"},
		{"allow-other allowed", true, func(t *testing.T, dir string) fuseSystem {
			bin := fakeFusermount(t, dir, true)
			conf := writeFile(t, dir, "fuse.conf", "mount_max = 1000\n  user_allow_other  # for leasefs\n")
			return fuseSystem{device: writeFile(t, dir, "fuse", ""), conf: conf, lookPath: func(string) (string, error) { return bin, nil }}
		}, "", "check that /dev/fuse is readable and writable by you"},
		{"nothing wrong", false, func(t *testing.T, dir string) fuseSystem {
			bin := fakeFusermount(t, dir, true)
			return fuseSystem{device: writeFile(t, dir, "fuse", ""), lookPath: func(string) (string, error) { return bin, nil }}
		}, "", "check that /dev/fuse is readable and writable by you"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			sys := c.setup(t, dir)
			mp := t.TempDir()
			cause := errors.New("fusermount exited with code 256")
			err := newFusermountError(mp, c.allowOther, cause, sys)
			if c.wantReason == "" && err.Reason != "" || !strings.Contains(err.Reason, c.wantReason) {
				t.Errorf("reason %q, want %q", err.Reason, c.wantReason)
			}
			if !strings.Contains(err.Hint, c.wantHint) {
				t.Errorf("hint %q, want it to contain %q", err.Hint, c.wantHint)
			}
			msg := err.Error()
			if !strings.Contains(msg, "cannot mount on "+mp+": ") || strings.Contains(msg, "code 256") {
				t.Errorf("message %q: want it to name %s and not go-fuse's exit code", msg, mp)
			}
			if c.wantReason == "" && !strings.Contains(msg, "fusermount3 failed (its message is printed above)") {
				t.Errorf("message %q: want it to point to fusermount3's own message", msg)
			}
			if !errors.Is(err, cause) {
				t.Errorf("errors.Is(%v, go-fuse's error) = false", err)
			}
		})
	}
}
