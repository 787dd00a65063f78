package cli

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

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
