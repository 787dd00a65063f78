package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

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
