package cli

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
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
