package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// protocolCite matches a citation of docs/PROTOCOL.md and what follows it up to the end of its
// sentence, in text whose whitespace is folded to single spaces.
var protocolCite = regexp.MustCompile(`docs/PROTOCOL\.md[^.)]*`)

// wantNoBareProtocolCite fails unless every citation of docs/PROTOCOL.md in page says that the
// file is in the source tree: an installed system has no docs/ directory.
func wantNoBareProtocolCite(t *testing.T, name string, page []byte) {
	t.Helper()
	text := strings.Join(strings.Fields(string(page)), " ")
	for _, c := range protocolCite.FindAllString(text, -1) {
		if !strings.Contains(c, "source tree") {
			t.Errorf("%s cites %q without saying it is in the source tree", name, c)
		}
	}
}

// "leasefs man DIR" writes a page per command; none points to docs/PROTOCOL.md as if it were
// installed.
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
		wantNoBareProtocolCite(t, page, data)
	}
}

// "leasefs man" without DIR prints the leasefs(1) page on stdout and writes nothing; two
// arguments are a usage error.
func TestManPrintsTheRootPage(t *testing.T) {
	t.Chdir(t.TempDir())
	r := runCLI(t, "man")
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("leasefs man: %+v, want exit 0 and no stderr", r)
	}
	for _, want := range []string{".TH \"LEASEFS\" \"1\"", "leasefs-lock(1)", "in the leasefs source tree"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("leasefs man: stdout lacks %q:\n%.600s", want, r.stdout)
		}
	}
	wantNoBareProtocolCite(t, "leasefs man", []byte(r.stdout))
	if got := tree(t, "."); len(got) != 1 {
		t.Errorf("leasefs man wrote files: %q", got)
	}
	if r := runCLI(t, "man", "a", "b"); r.code != exitUsage {
		t.Errorf("leasefs man a b: %+v, want exit %d", r, exitUsage)
	}
}
