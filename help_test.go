package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// The root help summarises the file protocol; every command has a
// description and examples.
func TestHelpTeaches(t *testing.T) {
	r := runCLI(t, "--help")
	for _, want := range []string{"set -C; : > m/name", "cat m/name", "echo \"$tok\" >| m/name", "rm m/name", "flock m/name cmd"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("leasefs --help lacks %q:\n%s", want, r.stdout)
		}
	}
	var stdout, stderr bytes.Buffer
	for _, c := range newRootCmd(&stdout, &stderr).Commands() {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			continue
		}
		if c.Short == "" || c.Example == "" {
			t.Errorf("leasefs %s: Short %q, Example %q; want both", c.Name(), c.Short, c.Example)
		}
	}
	if r := runCLI(t, "--version"); r.code != 0 || r.stdout != "leasefs "+version+"\n" {
		t.Errorf("leasefs --version = %d %q", r.code, r.stdout)
	}
}

// lock completes lease names (and namespaces, with a slash) under the
// mount; --state completes directories.
func TestCompletion(t *testing.T) {
	mnt := t.TempDir()
	for _, f := range []string{"alpha", "beta"} {
		if err := os.WriteFile(filepath.Join(mnt, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(mnt, "ns"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, cobra.ShellCompRequestCmd, "lock", "--mount", mnt, "")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if got := lines[:len(lines)-1]; !slices.Equal(got, []string{"alpha", "beta", "ns/"}) {
		t.Errorf("completion of lock NAME = %q", r.stdout)
	}
	r = runCLI(t, cobra.ShellCompRequestCmd, "lock", "--mount", mnt, "a")
	if !strings.HasPrefix(r.stdout, "alpha\n:") {
		t.Errorf("completion of lock a = %q", r.stdout)
	}
	r = runCLI(t, cobra.ShellCompRequestCmd, "status", "--state", "")
	if !strings.Contains(r.stdout, ":16") { // ShellCompDirectiveFilterDirs
		t.Errorf("completion of --state = %q, want directories", r.stdout)
	}
}

// "leasefs man DIR" writes a page per command.
func TestManPages(t *testing.T) {
	dir := t.TempDir()
	if r := runCLI(t, "man", dir); r.code != 0 {
		t.Fatalf("leasefs man: %+v", r)
	}
	for _, page := range []string{"leasefs.1", "leasefs-mount.1", "leasefs-lock.1", "leasefs-status.1", "leasefs-ls.1"} {
		data, err := os.ReadFile(filepath.Join(dir, page))
		if err != nil || !bytes.Contains(data, []byte(".TH \"LEASEFS\"")) {
			t.Errorf("%s: %v\n%.200s", page, err, data)
		}
	}
}

// --log-format json logs one JSON object per line; other formats are a
// usage error.
func TestLogFormat(t *testing.T) {
	var buf bytes.Buffer
	l, err := newLogger(&buf, "json", slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	l.Info("mounted", "mountpoint", "/m")
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil || m["msg"] != "mounted" || m["mountpoint"] != "/m" {
		t.Errorf("json log line %q: %v", buf.String(), err)
	}
	if r := runCLI(t, "mount", "--log-format", "xml", t.TempDir()); r.code != exitUsage {
		t.Errorf("--log-format xml: exit %d, want %d: %s", r.code, exitUsage, r.stderr)
	}
}
