package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxTrackedFile bounds the size of a file the repository tracks: sources,
// docs and test data, never a build output.
const maxTrackedFile = 1 << 20

// TestNoBinaryInTheTree checks every file git tracks: none is an ELF
// executable or object, and none is larger than 1 MiB (a built bench or
// leasefs binary committed by mistake is both). Build outputs are in
// .gitignore (CONTRIBUTING.md).
func TestNoBinaryInTheTree(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files in %s: %v", root, err)
	}
	files := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	if len(files) < 100 {
		t.Fatalf("git ls-files lists %d files: not the leasefs tree", len(files))
	}
	for _, f := range files {
		p := filepath.Join(root, f)
		fi, err := os.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the work tree, or a symlink
		}
		if fi.Size() > maxTrackedFile {
			t.Errorf("%s is %d bytes, more than %d: a build output?", f, fi.Size(), maxTrackedFile)
		}
		head := make([]byte, 4)
		if fd, err := os.Open(p); err == nil {
			n, _ := fd.Read(head)
			fd.Close()
			if bytes.Equal(head[:n], []byte("\x7fELF")) {
				t.Errorf("%s is an ELF binary: build outputs stay out of the tree (.gitignore)", f)
			}
		}
	}
}
