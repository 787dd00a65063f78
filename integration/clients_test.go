package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
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
func runClient(t *testing.T, env []string, argv ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
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
func sh(t *testing.T, script string, env ...string) result {
	t.Helper()
	return runClient(t, env, "bash", "-c", script)
}

// mustSh is [sh] that fails the test unless the script exits 0.
func mustSh(t *testing.T, script string, env ...string) result {
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
func py(t *testing.T, code string, env ...string) result {
	t.Helper()
	return runClient(t, env, "python3", "-c", pyPrelude+code)
}

// pyKV runs [py], fails the test unless it exits 0, and returns what it printed with out().
func pyKV(t *testing.T, code string, env ...string) map[string]string {
	t.Helper()
	r := py(t, code, env...)
	if r.code != 0 {
		t.Fatalf("python3: %s", r)
	}
	return r.kv(t)
}

// otherPython returns a python3 that uid 65534 can execute (pyenv shims under /root are not).
func otherPython(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "/usr/local/bin/python3"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return requireTool(t, "python3")
}

// pyAs runs [py]'s code as uid and gid 65534 (nobody) through setpriv and returns out() pairs.
func pyAsNobody(t *testing.T, code string, env ...string) map[string]string {
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
func (r result) kv(t *testing.T) map[string]string {
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
func wantKV(t *testing.T, kv map[string]string, key, want string) {
	t.Helper()
	if got, ok := kv[key]; !ok {
		t.Errorf("%s: missing from client output %v", key, kv)
	} else if got != want {
		t.Errorf("%s = %q, want %q", key, got, want)
	}
}

// reserve creates the lease file p with `set -C; : > p` and reads its token with cat.
func reserve(t *testing.T, p string) string {
	t.Helper()
	mustSh(t, `set -C; : > "$P"`, "P="+p)
	return readToken(t, p)
}

// readToken cats p and checks that it prints exactly one token line; it returns the token.
func readToken(t *testing.T, p string) string {
	t.Helper()
	r := mustSh(t, `cat "$P"`, "P="+p)
	if !tokenRE.MatchString(r.stdout) {
		t.Fatalf("first read of %s = %q, want a token line matching %s", p, r.stdout, tokenRE)
	}
	return strings.TrimSuffix(r.stdout, "\n")
}

// statusDoc cats p (whose token was already read) and parses the status document.
func statusDoc(t *testing.T, p string) (map[string]string, string) {
	t.Helper()
	r := mustSh(t, `cat "$P"`, "P="+p)
	if strings.Contains(r.stdout, "hwl_") {
		t.Fatalf("status document of %s reveals a token:\n%s", p, r.stdout)
	}
	return parseStatus(t, r.stdout), r.stdout
}

// parseStatus parses the top-level `key = value` lines of a TOML status document; quoted
// strings are unquoted, other values are kept verbatim.
func parseStatus(t *testing.T, doc string) map[string]string {
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
func statusTime(t *testing.T, st map[string]string, key string) time.Time {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, st[key])
	if err != nil {
		t.Fatalf("status %s = %q: %v", key, st[key], err)
	}
	return ts
}

// cliJSON runs `leasefs ARGS...` (which must include --json), requires exit 0 and decodes the
// JSON array it prints.
func cliJSON(t *testing.T, args ...string) []map[string]any {
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
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) time.Duration {
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
func listMount(t *testing.T, dir string) []string {
	t.Helper()
	r := mustSh(t, `ls -A "$D"`, "D="+dir)
	return strings.Fields(r.stdout)
}
