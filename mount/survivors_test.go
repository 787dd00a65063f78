package mount

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestDescribePIDs names unreadable processes with their command names,
// the first maxNamedPIDs of them.
func TestDescribePIDs(t *testing.T) {
	proc := t.TempDir()
	for pid, comm := range map[int]string{1: "init", 42: "sshd"} {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "comm"), []byte(comm+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := describePIDs(proc, []int{1, 42, 43}), "1 (init), 42 (sshd), 43"; got != want {
		t.Errorf("describePIDs = %q, want %q", got, want)
	}
	many := make([]int, maxNamedPIDs+3)
	for i := range many {
		many[i] = 100 + i
	}
	if got, want := describePIDs(proc, many), "100, 101, 102, 103, 104, 105, 106, 107, 108, 109 and 3 more"; got != want {
		t.Errorf("describePIDs of %d = %q, want %q", len(many), got, want)
	}
}
