package integration

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The documentation tests run the code of the documents in docFiles as
// it is written. A fenced code block is claimed by an HTML comment on the
// line right before its opening fence:
//
//	<!-- test: NAME [timeout=60s] [lease-duration=5m] -->
//	    run the block against a fresh mount: sh/bash with bash -euo pipefail,
//	    python with python3, js/javascript with node, go as the main package
//	    of a module that requires this one (replaced by the checkout); it
//	    must exit 0. lease-duration is the daemon's --lease-duration.
//	<!-- file: PATH -->
//	    write the block to PATH in the working directory of every test of
//	    the same document (executable when it starts with #!).
//	<!-- output: NAME -->
//	    what test NAME must print on stdout, trailing blank lines aside; a
//	    "…" matches any text within one line.
//	<!-- not tested: REASON -->
//	    a block of code that is deliberately not run, and why.
//
// Every block whose language is one a test can run must carry one of these
// (TestDocsMarkers), so that no example rots unnoticed. In every block and
// file, /mnt/leases stands for the test's mountpoint; the leasefs binary
// under test is first on PATH, and LEASEFS_MOUNT and LEASEFS_STATE name the
// test's daemon, so leasefs lock, ls and history find it.

// docFiles are the documents whose code blocks are tested, relative to the
// module root.
var docFiles = []string{"README.md", "docs/RECIPES.md", "docs/OPERATIONS.md", "CONTRIBUTING.md"}

// docMount is the mountpoint the documents use; tests substitute their own.
const docMount = "/mnt/leases"

// docDefaultTimeout bounds a test block without a timeout= option.
const docDefaultTimeout = 60 * time.Second

// runnableLangs maps a fence's info string to the language a test runs it
// as; fences of these languages must be marked.
var runnableLangs = map[string]string{
	"sh": "bash", "bash": "bash", "python": "python", "js": "node", "javascript": "node", "go": "go",
}

// docMarkerRE matches a marker comment: its kind and the rest.
var docMarkerRE = regexp.MustCompile(`^<!--\s*(test|file|output|not tested):\s*(.*?)\s*-->$`)

// docNameRE is what test names and output references look like.
var docNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// docBlock is one fenced code block of a document and the marker before it.
type docBlock struct {
	doc   string // document path relative to the module root
	line  int    // line number of the opening fence
	lang  string // the fence's info string, first word
	body  string
	kind  string // marker kind: test, file, output, not tested; "" when unmarked
	arg   string // the marker's text after the kind
	name  string // test or output: the test name; file: the path
	opts  map[string]string
	issue string // a malformed marker, described
}

// where names the block for messages.
func (b docBlock) where() string { return fmt.Sprintf("%s:%d", b.doc, b.line) }

// parseDoc returns the fenced blocks of the document at path (named doc in
// messages), and the lines holding a marker that no fence follows.
func parseDoc(path, doc string) (blocks []docBlock, stray []string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	lines := strings.Split(string(data), "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if strings.HasPrefix(line, "<!--") && docMarkerRE.MatchString(line) {
			if i+1 >= len(lines) || !strings.HasPrefix(strings.TrimSpace(lines[i+1]), "```") {
				stray = append(stray, fmt.Sprintf("%s:%d: %s", doc, i+1, line))
			}
			continue
		}
		if !strings.HasPrefix(line, "```") {
			continue
		}
		indent := lines[i][:len(lines[i])-len(strings.TrimLeft(lines[i], " "))]
		b := docBlock{doc: doc, line: i + 1}
		if f := strings.Fields(strings.TrimPrefix(line, "```")); len(f) > 0 {
			b.lang = f[0]
		}
		if i > 0 {
			b.parseMarker(strings.TrimSpace(lines[i-1]))
		}
		var body strings.Builder
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body.WriteString(strings.TrimPrefix(lines[i], indent) + "\n")
		}
		if i == len(lines) {
			return nil, nil, fmt.Errorf("%s: the fence opened there is never closed", b.where())
		}
		b.body = body.String()
		blocks = append(blocks, b)
	}
	return blocks, stray, nil
}

// parseMarker fills in the marker fields from the line before the fence.
func (b *docBlock) parseMarker(line string) {
	m := docMarkerRE.FindStringSubmatch(line)
	if m == nil {
		return
	}
	b.kind, b.arg = m[1], m[2]
	f := strings.Fields(b.arg)
	switch b.kind {
	case "not tested":
		if b.arg == "" {
			b.issue = "a not-tested marker without a reason"
		}
		return
	case "file":
		if len(f) != 1 || filepath.IsAbs(f[0]) || !filepath.IsLocal(f[0]) {
			b.issue = fmt.Sprintf("file marker %q: want one relative path", b.arg)
			return
		}
	case "test", "output":
		if len(f) == 0 || !docNameRE.MatchString(f[0]) {
			b.issue = fmt.Sprintf("%s marker %q: want a name of [a-z0-9-]", b.kind, b.arg)
			return
		}
	}
	if len(f) > 0 {
		b.name = f[0]
	}
	b.opts = map[string]string{}
	for _, o := range f[1:] {
		k, v, ok := strings.Cut(o, "=")
		if !ok || b.kind != "test" || (k != "timeout" && k != "lease-duration") {
			b.issue = fmt.Sprintf("%s marker: unknown option %q", b.kind, o)
			return
		}
		if _, err := time.ParseDuration(v); err != nil {
			b.issue = fmt.Sprintf("%s marker: option %s: %v", b.kind, o, err)
			return
		}
		b.opts[k] = v
	}
	if b.kind == "test" && runnableLangs[b.lang] == "" {
		b.issue = fmt.Sprintf("test %s: a %q block cannot be run", b.name, b.lang)
	}
}

// loadDocs parses every document of [docFiles] under the module root.
func loadDocs(t *testing.T) (root string, blocks []docBlock, stray []string) {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range docFiles {
		b, s, err := parseDoc(filepath.Join(root, doc), doc)
		if err != nil {
			t.Fatal(err)
		}
		blocks, stray = append(blocks, b...), append(stray, s...)
	}
	return root, blocks, stray
}

// Every block of code a test can run is either run by a test or says why
// not, markers are well formed and sit right before a fence, test names are
// unique, and outputs and files belong to a document with those tests.
func TestDocsMarkers(t *testing.T) {
	_, blocks, stray := loadDocs(t)
	for _, s := range stray {
		t.Errorf("%s: a marker must be the line right before a fence", s)
	}
	tests := map[string]docBlock{}
	outputs := map[string]docBlock{}
	files := map[string]bool{}
	for _, b := range blocks {
		if b.issue != "" {
			t.Errorf("%s: %s", b.where(), b.issue)
			continue
		}
		switch b.kind {
		case "":
			if runnableLangs[b.lang] != "" {
				t.Errorf("%s: a %s block without <!-- test: NAME --> or <!-- not tested: REASON -->", b.where(), b.lang)
			}
		case "test":
			if prev, ok := tests[b.name]; ok {
				t.Errorf("%s: test %s is also at %s", b.where(), b.name, prev.where())
			}
			tests[b.name] = b
		case "output":
			if prev, ok := outputs[b.name]; ok {
				t.Errorf("%s: a second output of %s (first at %s)", b.where(), b.name, prev.where())
			}
			outputs[b.name] = b
		case "file":
			key := b.doc + "\x00" + b.name
			if files[key] {
				t.Errorf("%s: file %s is written twice in %s", b.where(), b.name, b.doc)
			}
			files[key] = true
		}
	}
	for name, o := range outputs {
		if tb, ok := tests[name]; !ok || tb.doc != o.doc {
			t.Errorf("%s: output of %s, which is no test of %s", o.where(), name, o.doc)
		}
	}
	for key := range files {
		doc, name, _ := strings.Cut(key, "\x00")
		if !slices.ContainsFunc(blocks, func(b docBlock) bool { return b.doc == doc && b.kind == "test" }) {
			t.Errorf("%s: file %s, but the document has no test", doc, name)
		}
	}
	if len(tests) == 0 {
		t.Error("no test blocks found")
	}
}

// Every test block of the documents runs as written against a fresh mount
// and exits 0, printing its output block when it has one.
func TestDocs(t *testing.T) {
	root, blocks, _ := loadDocs(t)
	for _, doc := range docFiles {
		var files, tests []docBlock
		outputs := map[string]docBlock{}
		for _, b := range blocks {
			if b.doc != doc || b.issue != "" {
				continue
			}
			switch b.kind {
			case "file":
				files = append(files, b)
			case "test":
				tests = append(tests, b)
			case "output":
				outputs[b.name] = b
			}
		}
		t.Run(doc, func(t *testing.T) {
			for _, b := range tests {
				out, hasOut := outputs[b.name]
				t.Run(b.name, func(t *testing.T) {
					t.Parallel()
					runDocTest(t, root, b, files, out, hasOut)
				})
			}
		})
	}
}

// runDocTest runs test block b, with the document's files beside it, on a
// daemon of its own, and checks its exit status and output.
func runDocTest(t *testing.T, root string, b docBlock, files []docBlock, out docBlock, hasOut bool) {
	var lease time.Duration
	if v := b.opts["lease-duration"]; v != "" {
		lease, _ = time.ParseDuration(v)
	}
	timeout := docDefaultTimeout
	if v := b.opts["timeout"]; v != "" {
		timeout, _ = time.ParseDuration(v)
	}
	switch runnableLangs[b.lang] {
	case "python":
		requireTool(t, "python3")
	case "node":
		requireTool(t, "node")
	}
	d := startDaemon(t, daemonOpts{leaseDuration: lease})
	subst := func(s string) string { return strings.ReplaceAll(s, docMount, d.mountpoint) }
	work, scripts := t.TempDir(), t.TempDir()
	for _, f := range files {
		mode := os.FileMode(0o644)
		if strings.HasPrefix(f.body, "#!") {
			mode = 0o755
		}
		p := filepath.Join(work, f.name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(subst(f.body)), mode); err != nil {
			t.Fatal(err)
		}
	}
	body := subst(b.body)
	var argv []string
	switch runnableLangs[b.lang] {
	case "bash":
		argv = []string{"bash", "-euo", "pipefail", writeScript(t, scripts, "block.sh", body)}
	case "python":
		argv = []string{"python3", writeScript(t, scripts, "block.py", body)}
	case "node":
		argv = []string{"node", writeScript(t, scripts, "block.js", body)}
	case "go":
		argv = []string{buildDocGo(t, root, scripts, body)}
	}
	env := append(os.Environ(),
		"PATH="+filepath.Dir(leasefsBin)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"LEASEFS_MOUNT="+d.mountpoint, "LEASEFS_STATE="+d.state)
	r := runDocProcess(t, argv, work, env, timeout)
	if r.code != 0 {
		t.Fatalf("%s (%s block %s): %s", b.where(), b.lang, b.name, r)
	}
	t.Logf("%s: %s", b.where(), r)
	if hasOut {
		if re := outputPattern(subst(out.body)); !re.MatchString(strings.TrimRight(r.stdout, "\n")) {
			t.Errorf("%s: output of %s does not match %s:\n%s\nwant:\n%s", b.where(), b.name, out.where(), r.stdout, out.body)
		}
	}
}

// writeScript writes body to dir/name and returns its path.
func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// buildDocGo builds body as the main package of a module in dir that
// requires this module, replaced by the checkout at root, offline (the
// module cache holds the dependencies, and go.sum is this module's), and
// returns the program's path.
func buildDocGo(t *testing.T, root, dir, body string) string {
	t.Helper()
	goLine := "go 1.26"
	if f, err := os.Open(filepath.Join(root, "go.mod")); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "go ") {
				goLine = sc.Text()
				break
			}
		}
		f.Close()
	}
	mod := fmt.Sprintf("module example.com/docs\n\n%s\n\nrequire github.com/leasefs/leasefs v0.0.0\n\nreplace github.com/leasefs/leasefs => %s\n", goLine, root)
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	writeScript(t, dir, "go.mod", mod)
	writeScript(t, dir, "go.sum", string(sum))
	writeScript(t, dir, "main.go", body)
	prog := filepath.Join(dir, "prog")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", prog, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of the Go block: %v\n%s\n%s", err, out, body)
	}
	return prog
}

// runDocProcess runs argv in dir with env in a process group of its own,
// killing the group when timeout passes and after it exits (processes the
// block left behind), and returns its result. Output goes to files, so that
// a background process that keeps them open does not hold up the wait.
func runDocProcess(t *testing.T, argv []string, dir string, env []string, timeout time.Duration) result {
	t.Helper()
	outDir := t.TempDir()
	stdout, err := os.Create(filepath.Join(outDir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(filepath.Join(outDir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %q: %v", argv, err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	_ = cmd.Wait()
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	o, _ := os.ReadFile(stdout.Name())
	e, _ := os.ReadFile(stderr.Name())
	r := result{stdout: string(o), stderr: string(e), code: cmd.ProcessState.ExitCode()}
	if ctx.Err() != nil {
		t.Fatalf("%q timed out after %v: %s", argv, timeout, r)
	}
	return r
}

// outputPattern turns an expected-output block into a regular expression
// matching the whole output: literal text, with "…" standing for any text
// within a line.
func outputPattern(want string) *regexp.Regexp {
	parts := strings.Split(strings.TrimRight(want, "\n"), "…")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile(`\A` + strings.Join(parts, `[^\n]*`) + `\z`)
}
