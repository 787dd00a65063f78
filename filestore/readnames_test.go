package filestore

import (
	"github.com/leasefs/leasefs/leasecore"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadNamesMatchesReaddir: readNames lists exactly what
// os.File.Readdirnames lists, across many getdents64 buffers, for names
// of every length, and nothing for an empty directory.
func TestReadNamesMatchesReaddir(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 3000} {
		dir := t.TempDir()
		for i := range n {
			name := strings.Repeat(string(rune('a'+i%26)), 1+i%255) + "-" + leasecore.NewLeaseID()[:8+i%5]
			if len(name) > 255 {
				name = name[:255]
			}
			if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil && !os.IsExist(err) {
				t.Fatal(err)
			}
		}
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		want, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		got, err := readNames(fd)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%d files: readNames gave %d names, Readdirnames %d; first differences: %q", n, len(got), len(want), firstDiff(got, want))
		}
	}
}

func firstDiff(a, b []string) []string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return []string{a[i], b[i]}
		}
	}
	return nil
}
