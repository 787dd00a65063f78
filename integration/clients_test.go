package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// result is the outcome of a client process.
type result struct {
	stdout, stderr string
	code           int
}

// String describes the result for failure messages.
func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// runClient runs argv with extra environment (KEY=VALUE), working directory /, and a 30 s
// timeout; a timeout fails the test.
func runClient(t testing.TB, env []string, argv ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	argv = withStore(argv)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = "/"
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 2 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String(), code: -1}
	if cmd.ProcessState != nil {
		r.code = cmd.ProcessState.ExitCode()
	}
	if ctx.Err() != nil {
		t.Fatalf("%q timed out after %v: %s", argv, clientTimeout, r)
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("run %q: %v", argv, err)
	}
	return r
}

// sh runs script with `bash -c`; env entries are KEY=VALUE.
func sh(t testing.TB, script string, env ...string) result {
	t.Helper()
	return runClient(t, env, "bash", "-c", script)
}

// mustSh is [sh] that fails the test unless the script exits 0.
func mustSh(t testing.TB, script string, env ...string) result {
	t.Helper()
	r := sh(t, script, env...)
	if r.code != 0 {
		t.Fatalf("bash -c %q: %s", script, r)
	}
	return r
}

// pyPrelude is prepended to every python3 snippet. M is the mountpoint (env M); out(k, v)
// prints one JSON [key, value] line; err(fn, *args) returns "ok" or the errno name of the
// OSError fn raised; call(fn, *args) returns (value, "ok") or (None, errno name).
const pyPrelude = `import errno, json, os, sys
M = os.environ.get("M", "")
def out(k, v):
    if isinstance(v, bytes):
        v = v.decode("utf-8", "backslashreplace")
    print(json.dumps([k, str(v)]), flush=True)
def call(fn, *args):
    try:
        return fn(*args), "ok"
    except OSError as x:
        return None, errno.errorcode.get(x.errno, str(x.errno))
def err(fn, *args):
    return call(fn, *args)[1]
`

// py runs code with `python3 -c` after [pyPrelude]; env entries are KEY=VALUE.
func py(t testing.TB, code string, env ...string) result {
	t.Helper()
	return runClient(t, env, "python3", "-c", pyPrelude+code)
}

// pyKV runs [py], fails the test unless it exits 0, and returns what it printed with out().
func pyKV(t testing.TB, code string, env ...string) map[string]string {
	t.Helper()
	r := py(t, code, env...)
	if r.code != 0 {
		t.Fatalf("python3: %s", r)
	}
	return r.kv(t)
}

// otherPython returns a python3 that uid 65534 can execute (pyenv shims under /root are not).
func otherPython(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "/usr/local/bin/python3"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return requireTool(t, "python3")
}

// pyAs runs [py]'s code as uid and gid 65534 (nobody) through setpriv and returns out() pairs.
func pyAsNobody(t testing.TB, code string, env ...string) map[string]string {
	t.Helper()
	setpriv := requireTool(t, "setpriv")
	r := runClient(t, env, setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups",
		otherPython(t), "-c", pyPrelude+code)
	if r.code != 0 {
		t.Fatalf("python3 as nobody: %s", r)
	}
	return r.kv(t)
}

// kv parses the JSON [key, value] lines printed by out().
func (r result) kv(t testing.TB) map[string]string {
	t.Helper()
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var pair []string
		if json.Unmarshal(sc.Bytes(), &pair) == nil && len(pair) == 2 {
			m[pair[0]] = pair[1]
		}
	}
	return m
}

// wantKV checks that client output key has the value want.
func wantKV(t testing.TB, kv map[string]string, key, want string) {
	t.Helper()
	if got, ok := kv[key]; !ok {
		t.Errorf("%s: missing from client output %v", key, kv)
	} else if got != want {
		t.Errorf("%s = %q, want %q", key, got, want)
	}
}

// reserve creates the lease file p with `set -C; : > p` and reads its token with cat.
func reserve(t testing.TB, p string) string {
	t.Helper()
	mustSh(t, `set -C; : > "$P"`, "P="+p)
	return readToken(t, p)
}

// readToken cats p and checks that it prints exactly one token line; it returns the token.
func readToken(t testing.TB, p string) string {
	t.Helper()
	r := mustSh(t, `cat "$P"`, "P="+p)
	if !tokenRE.MatchString(r.stdout) {
		t.Fatalf("first read of %s = %q, want a token line matching %s", p, r.stdout, tokenRE)
	}
	return strings.TrimSuffix(r.stdout, "\n")
}

// statusDoc cats p (whose token was already read) and parses the status document.
func statusDoc(t testing.TB, p string) (map[string]string, string) {
	t.Helper()
	r := mustSh(t, `cat "$P"`, "P="+p)
	if strings.Contains(r.stdout, "hwl_") {
		t.Fatalf("status document of %s reveals a token:\n%s", p, r.stdout)
	}
	return parseStatus(t, r.stdout), r.stdout
}

// parseStatus parses the top-level `key = value` lines of a TOML status document; quoted
// strings are unquoted, other values are kept verbatim.
func parseStatus(t testing.TB, doc string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for line := range strings.SplitSeq(doc, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Errorf("status document line %q is not key = value", line)
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if strings.HasPrefix(v, `"`) {
			if s, err := strconv.Unquote(v); err == nil {
				v = s
			}
		}
		m[k] = v
	}
	return m
}

// statusTime parses a datetime field of a status document.
func statusTime(t testing.TB, st map[string]string, key string) time.Time {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, st[key])
	if err != nil {
		t.Fatalf("status %s = %q: %v", key, st[key], err)
	}
	return ts
}

// cliJSON runs `leasefs ARGS...` (which must include --json), requires exit 0 and decodes the
// JSON array it prints.
func cliJSON(t testing.TB, args ...string) []map[string]any {
	t.Helper()
	r := runClient(t, nil, append([]string{leasefsBin}, args...)...)
	if r.code != 0 {
		t.Fatalf("leasefs %q: %s", args, r)
	}
	var out []map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("leasefs %q: stdout is not a JSON array of objects: %v\n%s", args, err, r.stdout)
	}
	return out
}

// findLease returns the entry of a `ls --json`/`history --json` listing with the lease id.
func findLease(entries []map[string]any, leaseID string) map[string]any {
	for _, e := range entries {
		if fmt.Sprint(e["lease_id"]) == leaseID {
			return e
		}
	}
	return nil
}

// eventually polls cond every 50 ms until it returns true or timeout passes, then fails the
// test with what and cond's last detail. It returns how long it took.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		ok, detail := cond()
		if ok {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %v (%s)", what, timeout, detail)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// listMount lists dir inside the mount with `ls -A` in a client process.
func listMount(t testing.TB, dir string) []string {
	t.Helper()
	r := mustSh(t, `ls -A "$D"`, "D="+dir)
	return strings.Fields(r.stdout)
}

// watchBuffer collects a process's output and lets a test wait for a pattern in it without
// polling. It is safe for concurrent use.
type watchBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced at every Write
}

func newWatchBuffer() *watchBuffer { return &watchBuffer{changed: make(chan struct{})} }

// Write appends p and wakes every waiter.
func (w *watchBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	close(w.changed)
	w.changed = make(chan struct{})
	return len(p), nil
}

// String returns everything written so far.
func (w *watchBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// match returns re's submatches in the output so far and a channel closed at the next Write.
func (w *watchBuffer) match(re *regexp.Regexp) ([]string, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return re.FindStringSubmatch(w.buf.String()), w.changed
}

// bgProc is a client process running in the background, in its own process group, with its
// stdin a pipe from the test and its stdout watched. Cleanup SIGKILLs the group.
type bgProc struct {
	t      testing.TB
	argv   []string
	cmd    *exec.Cmd
	pid    int
	stdin  io.WriteCloser
	stdout *watchBuffer
	stderr *watchBuffer
	exited chan struct{} // closed once the process has been waited for
}

// startProc starts argv in the background with extra environment (KEY=VALUE), working
// directory / and its own process group.
func startProc(t testing.TB, env []string, argv ...string) *bgProc {
	t.Helper()
	argv = withStore(argv)
	p := &bgProc{t: t, argv: argv, stdout: newWatchBuffer(), stderr: newWatchBuffer(), exited: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Dir = "/"
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.WaitDelay = 2 * time.Second
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatalf("stdin pipe for %q: %v", argv, err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %q: %v", argv, err)
	}
	p.pid = p.cmd.Process.Pid
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.killGroup()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("%q (pid %d) not reaped 10s after SIGKILL", argv, p.pid)
		}
	})
	return p
}

// startPy starts code with `python3 -u -c` after [pyPrelude] in the background.
func startPy(t testing.TB, code string, env ...string) *bgProc {
	t.Helper()
	return startProc(t, env, otherPython(t), "-u", "-c", pyPrelude+code)
}

// String describes the process and its output for failure messages.
func (p *bgProc) String() string {
	state := "running"
	select {
	case <-p.exited:
		state = fmt.Sprintf("exit %d", p.cmd.ProcessState.ExitCode())
	default:
	}
	return fmt.Sprintf("%q pid %d (%s)\nstdout:\n%s\nstderr:\n%s", p.argv, p.pid, state, p.stdout.String(), p.stderr.String())
}

// expect waits up to timeout for stdout to match pattern and returns the submatches; it fails
// the test if the process exits or the time passes first.
func (p *bgProc) expect(pattern string, timeout time.Duration) []string {
	p.t.Helper()
	re := regexp.MustCompile(pattern)
	deadline := time.After(timeout)
	for {
		m, changed := p.stdout.match(re)
		if m != nil {
			return m
		}
		select {
		case <-changed:
		case <-p.exited:
			if m, _ := p.stdout.match(re); m != nil {
				return m
			}
			p.t.Fatalf("waiting for %q: process exited first: %s", pattern, p)
		case <-deadline:
			p.t.Fatalf("waiting for %q: not seen after %v: %s", pattern, timeout, p)
		}
	}
}

// expectKey waits for an out(key, value) line on stdout and returns the value.
func (p *bgProc) expectKey(key string, timeout time.Duration) string {
	p.t.Helper()
	m := p.expect(`(?m)^\[`+regexp.QuoteMeta(strconv.Quote(key))+`, "(.*)"\]$`, timeout)
	var v string
	if err := json.Unmarshal([]byte(`"`+m[1]+`"`), &v); err != nil {
		p.t.Fatalf("decode %s value %q: %v", key, m[1], err)
	}
	return v
}

// send writes line and a newline to the process's stdin.
func (p *bgProc) send(line string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		p.t.Fatalf("write to stdin of %s: %v", p, err)
	}
}

// running reports whether the process has not exited yet.
func (p *bgProc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// signal sends sig to the process (not its group); a process already gone is ignored.
func (p *bgProc) signal(sig syscall.Signal) {
	_ = syscall.Kill(p.pid, sig)
}

// killGroup SIGKILLs the process's whole group (the process and every child it started).
func (p *bgProc) killGroup() {
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
}

// wait waits up to timeout for the process to exit and returns its result; it fails the test
// if the process is still running then.
func (p *bgProc) wait(timeout time.Duration) result {
	p.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(timeout):
		p.t.Fatalf("still running after %v: %s", timeout, p)
	}
	return result{stdout: p.stdout.String(), stderr: p.stderr.String(), code: p.cmd.ProcessState.ExitCode()}
}

// kv parses the out() lines the process has printed so far.
func (p *bgProc) kv() map[string]string {
	p.t.Helper()
	return result{stdout: p.stdout.String()}.kv(p.t)
}
