package cli

import (
	"context"
	"github.com/leasefs/leasefs/filestore"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/leasefs/leasefs/leasecore"
)

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
	s, err := filestore.Open(state, filestore.Options{})
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
