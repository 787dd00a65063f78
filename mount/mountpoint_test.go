package mount

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// writeFile writes data to dir/name and returns the path.
func writeFile(t *testing.T, dir, name, data string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMountpointError(t *testing.T) {
	dir := t.TempDir()
	file := writeFile(t, dir, "file", "")
	cases := []struct {
		mp, want string
		is       error
	}{
		{filepath.Join(dir, "missing"), "mount: mountpoint " + filepath.Join(dir, "missing") + " does not exist", os.ErrNotExist},
		{file, "mount: mountpoint " + file + " is not a directory", nil},
		{filepath.Join(file, "sub"), "mount: mountpoint " + filepath.Join(file, "sub") + " is not a directory", nil},
	}
	for _, c := range cases {
		err := checkMountpoint(c.mp)
		var me *MountpointError
		if !errors.As(err, &me) || err.Error() != c.want {
			t.Errorf("checkMountpoint(%s) = %v, want %q", c.mp, err, c.want)
		}
		if c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("checkMountpoint(%s) = %v, want it to match %v", c.mp, err, c.is)
		}
	}
	if err := checkMountpoint(dir); err != nil {
		t.Errorf("checkMountpoint of a directory: %v", err)
	}
}
