package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	code := Run(context.Background(), args, &stdout, &stderr)
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
