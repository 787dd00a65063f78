package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/refusal"
	"github.com/leasefs/leasefs/internal/testenv"
)

// Other users: with --allow-other, uid 65534 (nobody) attacks root's leases
// through the mount and the state directory, and a process of the holder's own uid that lacks
// the token brute-forces it. This extends TestOtherUID (status readable, write/unlink refused,
// an unread token not revealed) and TestFlockOtherUID (flock on a handle lease) without
// repeating them.

// nobodyUID is the uid (and gid) of the other user.
const nobodyUID = 65534

// nobodyArgv returns the argv that runs python3 code (after [pyPrelude]) as uid and gid 65534.
func nobodyArgv(t testing.TB, code string) []string {
	t.Helper()
	setpriv := requireTool(t, "setpriv")
	return []string{setpriv, "--reuid", strconv.Itoa(nobodyUID), "--regid", strconv.Itoa(nobodyUID), "--clear-groups",
		otherPython(t), "-u", "-c", pyPrelude + code}
}

// startUsersDaemon starts a daemon with --allow-other whose mountpoint and state directory
// uid 65534 can reach, so that only the state directory's own mode keeps it out.
func startUsersDaemon(t *testing.T) *daemon {
	t.Helper()
	testenv.RequireFUSE(t)
	mp := t.TempDir()
	stateParent := t.TempDir()
	// t.TempDir's per-test parent is 0700; open it so that nobody can walk to both.
	if err := os.Chmod(filepath.Dir(mp), 0o755); err != nil {
		t.Fatal(err)
	}
	return startDaemon(t, daemonOpts{mountpoint: mp, state: filepath.Join(stateParent, "state"), allowOther: true,
		metricsAddr: "127.0.0.1:0"})
}

// recordHashes returns the token_hash of every record in the state directory.
func recordHashes(t testing.TB, state string) []string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^token_hash = "([0-9a-f]+)"`)
	var out []string
	for rel, data := range stateSnapshot(t, state) {
		// Records only: the journal and the spare files hold copies of old versions.
		if !strings.HasPrefix(rel, "writer-leases/lease-") || !strings.HasSuffix(rel, ".toml") {
			continue
		}
		if m := re.FindStringSubmatch(data); m != nil {
			out = append(out, m[1])
		}
	}
	slices.Sort(out)
	return out
}

// revealsSecret reports which secret (token or token hash) s contains, if any.
func revealsSecret(s string, hashes []string) string {
	if strings.Contains(s, "hwl_") {
		return "a token"
	}
	for _, h := range hashes {
		if strings.Contains(s, h) {
			return "a token hash"
		}
	}
	return ""
}

// TestReliabilityUsers runs the other-user checks and records the forbidden attempts refused,
// the brute-force tokens tried, the holder's renew latency without and with the brute forcer,
// and the violations found. It is not parallel, so that the latency figures are measured
// while no other integration test runs.
func TestReliabilityUsers(t *testing.T) {
	testenv.RequireFUSE(t)
	tl := newOutcomeTally()
	latency := map[string]string{}
	t.Cleanup(func() {
		recordFigure("other users", "forbidden attempts refused", tl.get("refused"))
		recordFigure("other users", "brute-force tokens tried", tl.get("tried"))
		for _, m := range []string{
			"holder renew p50/p99 idle",
			"holder renew p50/p99 under brute force",
			"holder renew slowdown under brute force (p50, p99)",
		} {
			if v, ok := latency[m]; ok {
				recordFigure("other users", m, v)
			}
		}
		recordFigure("other users", "violations", tl.get("violations"))
	})
	t.Run("forbidden", func(t *testing.T) { testOtherUIDForbidden(t, tl) })
	t.Run("first read race", func(t *testing.T) { testOtherUIDFirstReadRace(t, tl) })
	t.Run("inherited descriptor", func(t *testing.T) { testOtherUIDInheritedDescriptor(t, tl) })
	t.Run("state directory", func(t *testing.T) { testStateDirModes(t, tl) })
	t.Run("brute force", func(t *testing.T) { testBruteForce(t, tl, latency) })
}

// pyForbidden is run as nobody: every attempt to change, take, read the token of, or reach
// the records of root's leases $NAMES (space-separated paths relative to $M) and namespaces,
// each printed as out("<name>:<attempt>", errno name or "ok"/"opened"). It then prints what
// it could read: out("<name>:read", the document) and out("<name>:xattrs", JSON of the
// user.lease.* values).
const pyForbidden = `
import fcntl, signal
class Alarm(Exception):
    pass
def on_alarm(*a):
    raise Alarm()
signal.signal(signal.SIGALRM, on_alarm)
def tryopen(p, flags):
    fd, r = call(os.open, p, flags, 0o644)
    if fd is None:
        return r
    os.close(fd)
    return "opened"
def waitlock(fd):
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = "ok"
    except Alarm:
        r = "EINTR"
    except OSError as x:
        r = errno.errorcode.get(x.errno, str(x.errno))
    signal.setitimer(signal.ITIMER_REAL, 0)
    return r
S = os.environ["S"]
for name in os.environ["NAMES"].split():
    p = os.path.join(M, name)
    k = name + ":"
    out(k + "open_wronly", tryopen(p, os.O_WRONLY))
    out(k + "open_rdwr", tryopen(p, os.O_RDWR))
    out(k + "open_trunc", tryopen(p, os.O_WRONLY | os.O_TRUNC))
    out(k + "open_creat_wronly", tryopen(p, os.O_CREAT | os.O_WRONLY))
    out(k + "open_creat_excl", tryopen(p, os.O_CREAT | os.O_EXCL | os.O_RDWR))
    out(k + "truncate", err(os.truncate, p, 0))
    out(k + "utime_now", err(os.utime, p))
    out(k + "utime_set", err(os.utime, p, (0, 0)))
    out(k + "chmod", err(os.chmod, p, 0o666))
    out(k + "chown", err(os.chown, p, 65534, 65534))
    out(k + "rename", err(os.rename, p, p + "-stolen"))
    out(k + "link", err(os.link, p, p + "-link"))
    out(k + "symlink_over", err(os.symlink, "/tmp", p))
    out(k + "setxattr", err(os.setxattr, p, "user.lease.status", b"complete"))
    out(k + "removexattr", err(os.removexattr, p, "user.lease.status"))
    out(k + "unlink", err(os.unlink, p))
    fd = os.open(p, os.O_RDONLY)
    out(k + "flock_nb", err(fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
    out(k + "flock_sh", err(fcntl.flock, fd, fcntl.LOCK_SH | fcntl.LOCK_NB))
    out(k + "lockf", err(fcntl.lockf, fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
    out(k + "flock_wait", waitlock(fd))
    out(k + "write_rdonly_fd", err(os.write, fd, b"takeover"))
    # What nobody may read: the status document (byte by byte, then whole) and the xattrs.
    one = b""
    while True:
        b = os.read(fd, 1)
        if not b:
            break
        one += b
    out(k + "read_bytes", one)
    out(k + "read", os.pread(fd, 65536, 0))
    os.close(fd)
    xs = {}
    for x in os.listxattr(p):
        xs[x] = os.getxattr(p, x).decode("utf-8", "backslashreplace")
    out(k + "xattrs", json.dumps(xs))
for ns in os.environ["NAMESPACES"].split():
    p = os.path.join(M, ns)
    out(ns + ":rmdir", err(os.rmdir, p))
    out(ns + ":rename", err(os.rename, p, p + "-stolen"))
    out(ns + ":chmod", err(os.chmod, p, 0o777))
    out(ns + ":utime_set", err(os.utime, p, (0, 0)))
for rel in ("", "writer-leases", "writer-leases/" + os.environ["RECORD"], "namespaces.toml", "generation", "leasefs.lock.json"):
    p = os.path.join(S, rel)
    if rel == "":
        out("state:state:list", err(os.listdir, p))  # stat of the directory itself is allowed
        continue
    if rel == "writer-leases":
        out("state:" + rel + ":list", err(os.listdir, p))
    else:
        out("state:" + rel + ":open", tryopen(p, os.O_RDONLY))
    out("state:" + rel + ":stat", err(os.stat, p))
`

// forbiddenWant lists, per attempt of [pyForbidden], the refusals that keep root's lease
// intact. Where the kernel refuses before asking the daemon (default_permissions: mode 0644,
// the sticky 01777 directories) its errno is the one listed.
var forbiddenWant = map[string][]string{
	"open_wronly":       {"EACCES"},
	"open_rdwr":         {"EACCES"},
	"open_trunc":        {"EACCES"},
	"open_creat_wronly": {"EACCES"},
	"open_creat_excl":   {"EEXIST"},
	"truncate":          {"EACCES"},
	"utime_now":         {"EACCES", "EPERM"},
	"utime_set":         {"EPERM"},
	"chmod":             {"EPERM"},
	"chown":             {"EPERM"},
	"rename":            {"EPERM"},
	"link":              {"EPERM"},
	"symlink_over":      {"EEXIST"},
	"setxattr":          {"EACCES", "EPERM"},
	"removexattr":       {"EACCES", "EPERM"},
	"unlink":            {"EPERM"},
	"flock_nb":          {"EWOULDBLOCK", "EAGAIN"},
	"flock_sh":          {"ENOLCK"},
	"lockf":             {"EBADF"}, // a write lock needs a descriptor open for writing
	"flock_wait":        {"EINTR"},
	"write_rdonly_fd":   {"EBADF"},
	"rmdir":             {"EPERM"},
	"ns_rename":         {"EPERM"},
	"ns_chmod":          {"EPERM"},
	"ns_utime_set":      {"EPERM"},
	"list":              {"EACCES"},
	"open":              {"EACCES"},
	"stat":              {"EACCES"},
}

// testOtherUIDForbidden has nobody try every change, takeover and lock on root's token lease
// (token read), root's unread token lease, root's lease inside root's namespace and root's
// flock handle lease, plus root's namespaces and the state directory. Every attempt must be
// refused with the documented errno, no read may reveal a token or a token hash, and root's
// leases must be byte-for-byte unchanged on disk and in their status documents.
func testOtherUIDForbidden(t *testing.T, tl *outcomeTally) {
	d := startUsersDaemon(t)
	m := d.mountpoint
	tok := reserve(t, filepath.Join(m, "target"))
	mustSh(t, `set -C; : > "$M/unread" && mkdir "$M/rootns" "$M/emptyns" && : > "$M/rootns/inner"`, "M="+m)
	readToken(t, filepath.Join(m, "rootns/inner"))
	holder := startPy(t, pyFlockHolder, "P="+filepath.Join(m, "handle"))
	holder.expectKey("held", holdTimeout)

	names := []string{"target", "unread", "rootns/inner", "handle"}
	docs := map[string]string{}
	for _, n := range []string{"target", "rootns/inner", "handle"} {
		_, docs[n] = statusDoc(t, filepath.Join(m, n))
	}
	before := settledSnapshot(t, d)
	hashes := recordHashes(t, d.state)
	st, _ := statusDoc(t, filepath.Join(m, "target"))
	record := st["lease_id"] + ".toml"

	r := runClient(t, []string{"M=" + m, "S=" + d.state, "NAMES=" + strings.Join(names, " "),
		"NAMESPACES=rootns emptyns", "RECORD=" + record}, nobodyArgv(t, pyForbidden)...)
	if r.code != 0 {
		t.Fatalf("python3 as nobody: %s", r)
	}
	kv := r.kv(t)
	checked := 0
	for _, key := range slices.Sorted(maps.Keys(kv)) {
		subject, attempt, _ := strings.Cut(key, ":")
		if i := strings.LastIndex(attempt, ":"); i >= 0 { // state:<path>:<attempt>
			attempt = attempt[i+1:]
		}
		switch {
		case attempt == "read" || attempt == "read_bytes" || attempt == "xattrs":
			if what := revealsSecret(kv[key], hashes); what != "" {
				tl.violation(t, "nobody's %s of root's %s revealed %s:\n%s", attempt, subject, what, kv[key])
			}
			if attempt != "xattrs" && !strings.Contains(kv[key], `lease_id = "lease-`) {
				t.Errorf("nobody's %s of root's %s = %q, want the status document", attempt, subject, kv[key])
			}
			continue
		case subject == "rootns" || subject == "emptyns":
			if attempt != "rmdir" {
				attempt = "ns_" + attempt
			}
		}
		want, ok := forbiddenWant[attempt]
		if !ok {
			t.Errorf("no expectation for nobody's attempt %s", key)
			continue
		}
		checked++
		if slices.Contains(want, kv[key]) {
			tl.add("refused", 1)
		} else {
			tl.violation(t, "nobody's %s on root's %s answered %s, want %v", attempt, subject, kv[key], want)
		}
	}
	if want := len(names)*21 + 2*4 + 1 + 5*2; checked != want {
		t.Errorf("checked %d of nobody's attempts, want %d: %v", checked, want, kv)
	}

	// Root's leases are unchanged: records byte for byte, status documents, the token.
	if diff := diffSnapshots(before, stateSnapshot(t, d.state)); diff != "" {
		tl.violation(t, "nobody's attempts changed the state directory:\n%s", diff)
	}
	for n, doc := range docs {
		if _, now := statusDoc(t, filepath.Join(m, n)); now != doc {
			tl.violation(t, "root's %s after nobody's attempts:\n%s\nwant unchanged:\n%s", n, now, doc)
		}
	}
	readToken(t, filepath.Join(m, "unread")) // nobody's reads did not burn root's token
	if r := sh(t, `echo "$TOK" >| "$P"`, "TOK="+tok, "P="+filepath.Join(m, "target")); r.code != 0 {
		tl.violation(t, "root's renew after nobody's attempts: %s", r)
	}
	if !holder.running() {
		tl.violation(t, "root's flock holder died: %s", holder)
	}
	if got := listMount(t, m); !slices.Equal(got, []string{"emptyns", "handle", "rootns", "target", "unread"}) {
		tl.violation(t, "mount after nobody's attempts lists %v", got)
	}
}

// testOtherUIDFirstReadRace makes nobody's read the very first read of fresh leases: nobody
// polls each name until root creates it (without reading it), and reads it at once. The
// daemon must answer the status document, and root's own first read afterwards the token.
func testOtherUIDFirstReadRace(t *testing.T, tl *outcomeTally) {
	d := startUsersDaemon(t)
	m := d.mountpoint
	const n = 20
	reader := startProc(t, []string{"M=" + m, "N=" + strconv.Itoa(n)}, nobodyArgv(t, `
import time
for i in range(int(os.environ["N"])):
    p = os.path.join(M, "race%d" % i)
    deadline = time.monotonic() + 20
    while True:
        fd, r = call(os.open, p, os.O_RDONLY)
        if fd is not None:
            data, r = call(os.pread, fd, 4096, 0)
            os.close(fd)
            if data is not None:
                break
        if time.monotonic() > deadline:
            out("timeout%d" % i, r)
            sys.exit(1)
    out("first%d" % i, data)
`)...)
	for i := range n {
		p := filepath.Join(m, fmt.Sprintf("race%d", i))
		mustSh(t, `set -C; : > "$P"`, "P="+p) // O_WRONLY: the reserving handle reads nothing
		first := reader.expectKey(fmt.Sprintf("first%d", i), holdTimeout)
		tl.add("refused", 1)
		if strings.Contains(first, "hwl_") || !strings.Contains(first, `resource = "race`) {
			tl.add("refused", -1)
			tl.violation(t, "nobody's first read of root's fresh lease race%d = %q, want the status document", i, first)
		}
		readToken(t, p)
	}
	reader.wait(10 * time.Second)
}

// testOtherUIDInheritedDescriptor hands root's own reserving descriptor (open for reading
// and writing, token unread) to a nobody process. The daemon authorises each read and write
// by the caller's uid, not by the descriptor: nobody reads the status document, not the
// token, and its writes of the right token and of release commands are refused with EACCES.
func testOtherUIDInheritedDescriptor(t *testing.T, tl *outcomeTally) {
	d := startUsersDaemon(t)
	m := d.mountpoint
	argv := nobodyArgv(t, "")
	kv := pyKV(t, `
import subprocess
p = os.path.join(M, "inherit")
fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
argv = json.loads(os.environ["ARGV"])
def as_nobody(code, **env):
    e = dict(os.environ, FD=str(fd), **env)
    r = subprocess.run(argv[:-1] + [argv[-1] + code], pass_fds=[fd], env=e, capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        raise SystemExit("nobody: " + r.stdout + r.stderr)
    return dict(json.loads(l) for l in r.stdout.splitlines())
got = as_nobody("""
fd = int(os.environ["FD"])
out("uid", os.getuid())
out("read", os.pread(fd, 4096, 0))
""")
out("nobody_uid", got["uid"])
out("nobody_first_read", got["read"])
tok = os.pread(fd, 4096, 0).decode()
out("root_first_read", tok)
tok = tok.strip()
got = as_nobody("""
fd = int(os.environ["FD"])
tok = os.environ["TOK"]
out("renew", err(os.write, fd, (tok + "\\n").encode()))
out("renew_toml", err(os.write, fd, ('token = "%s"\\nclient = "nobody"\\n' % tok).encode()))
out("complete", err(os.write, fd, ('token = "%s"\\naction = "complete"\\n' % tok).encode()))
out("abandon", err(os.write, fd, ('token = "%s"\\naction = "abandon"\\n' % tok).encode()))
out("ftruncate", err(os.ftruncate, fd, 0))
out("read", os.pread(fd, 4096, 0))
""", TOK=tok)
for k, v in got.items():
    out("nobody_" + k, v)
out("root_renew", err(os.write, fd, (tok + "\n").encode()))
`, "M="+m, "ARGV="+mustJSON(t, argv))
	wantKV(t, kv, "nobody_uid", strconv.Itoa(nobodyUID))
	if strings.Contains(kv["nobody_first_read"], "hwl_") || !strings.Contains(kv["nobody_first_read"], "lease_id") {
		tl.violation(t, "nobody's first read through root's reserving descriptor = %q, want the status document", kv["nobody_first_read"])
	} else {
		tl.add("refused", 1)
	}
	if !tokenRE.MatchString(kv["root_first_read"]) {
		tl.violation(t, "root's first read after nobody's = %q, want the token", kv["root_first_read"])
	}
	for _, op := range []string{"renew", "renew_toml", "complete", "abandon"} {
		if got := kv["nobody_"+op]; got == "EACCES" {
			tl.add("refused", 1)
		} else {
			tl.violation(t, "nobody's %s with the right token through root's descriptor answered %s, want EACCES", op, got)
		}
	}
	if got := kv["nobody_ftruncate"]; got == "EPERM" || got == "EACCES" {
		tl.add("refused", 1)
	} else {
		tl.violation(t, "nobody's ftruncate through root's descriptor answered %s, want EPERM", got)
	}
	if doc := kv["nobody_read"]; strings.Contains(doc, "hwl_") || strings.Contains(doc, `client = "nobody"`) {
		tl.violation(t, "root's lease after nobody's writes:\n%s", doc)
	}
	wantKV(t, kv, "root_renew", "ok")
	if st, _ := statusDoc(t, filepath.Join(m, "inherit")); st["status"] != "active" || st["client"] != "" || st["holder_uid"] != "0" {
		tl.violation(t, "root's lease after nobody's writes through its descriptor: %v", st)
	}
}

// mustJSON encodes v as JSON.
func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// testStateDirModes checks docs/PROTOCOL.md §7: the state directory and the leases directory are 0700,
// records and every other file 0600 (no group or other access at all), all owned by the
// daemon's uid, after leases of two uids and a namespace were created.
func testStateDirModes(t *testing.T, tl *outcomeTally) {
	d := startUsersDaemon(t)
	m := d.mountpoint
	reserve(t, filepath.Join(m, "root-lease"))
	mustSh(t, `mkdir "$M/ns"`, "M="+m)
	kv := pyAsNobody(t, `
fd = os.open(os.path.join(M, "nobody-lease"), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
out("token", os.read(fd, 4096))
os.close(fd)
`, "M="+m)
	if !tokenRE.MatchString(kv["token"]) {
		t.Fatalf("nobody's reservation: %v", kv)
	}
	n := 0
	defer lockStoreShared(t, d.state)()
	err := filepath.WalkDir(d.state, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) && strings.HasPrefix(e.Name(), ".free-") {
			return nil // an empty spare the daemon's spare maker discarded meanwhile
		}
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		if e.IsDir() {
			want = 0o700 | fs.ModeDir
		}
		n++
		if info.Mode() != want {
			tl.violation(t, "%s has mode %v, want %v", p, info.Mode(), want)
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
			tl.violation(t, "%s is owned by uid %d, want the daemon's", p, st.Uid)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 6 {
		t.Errorf("walked %d entries of the state directory, want at least 6", n)
	}
	t.Logf("checked the modes of %d entries of the state directory", n)
}

// pyRenewHolder reserves $P, reads its token, reports out("ready"), then for every stdin line
// "LABEL COUNT" renews COUNT times through its reserving descriptor, timing each write, and
// reports LABEL_p50_us, LABEL_p99_us, LABEL_errors and LABEL_done.
const pyRenewHolder = `
import time
fd = os.open(os.environ["P"], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
tok = os.read(fd, 4096).decode().strip()
out("token", tok)
out("ready", os.getpid())
payload = (tok + "\n").encode()
for line in sys.stdin:
    label, count = line.split()
    lat, errs = [], 0
    for _ in range(int(count)):
        t0 = time.perf_counter_ns()
        r = err(os.write, fd, payload)
        lat.append(time.perf_counter_ns() - t0)
        if r != "ok":
            errs += 1
            out(label + "_err", r)
    lat.sort()
    out(label + "_p50_us", lat[len(lat) // 2] // 1000)
    out(label + "_p99_us", lat[min(len(lat) - 1, len(lat) * 99 // 100)] // 1000)
    out(label + "_errors", errs)
    out(label + "_done", "1")
`

// pyBruteForcer opens $P for writing, as the holder's uid, and writes random well-formed
// wrong tokens as fast as it can — bare, as renew commands with an annotation, and as
// complete and abandon commands — until it has tried $MIN and the file $STOP exists. It
// reports out("started") after 50 attempts and then tried, counts (by errno name) and rate.
const pyBruteForcer = `
import secrets, time
fd = os.open(os.environ["P"], os.O_WRONLY)
stop, minimum = os.environ["STOP"], int(os.environ["MIN"])
alphabet = "abcdefghijklmnopqrstuvwxyz234567"
counts, n, t0 = {}, 0, time.monotonic()
while n < minimum or not os.path.exists(stop):
    guess = "hwl_" + "".join(secrets.choice(alphabet) for _ in range(39))
    k = n % 4
    if k == 0:
        payload = guess + "\n"
    elif k == 1:
        payload = 'token = "%s"\nclient = "brute"\n' % guess
    elif k == 2:
        payload = 'token = "%s"\naction = "complete"\n' % guess
    else:
        payload = 'token = "%s"\naction = "abandon"\n' % guess
    r = err(os.write, fd, payload.encode())
    counts[r] = counts.get(r, 0) + 1
    n += 1
    if n == 50:
        out("started", "1")
out("tried", n)
out("counts", json.dumps(counts))
out("rate", "%.0f" % (n / (time.monotonic() - t0)))
`

// testBruteForce measures the holder's renew latency (200 renews) idle, then again while a
// process of the holder's own uid (65534), which lacks the token, writes at least 2000 wrong
// tokens as fast as it can. Every guess must be refused with EACCES, the lease must stay
// unchanged, and the latencies are stored in figures for the report (not asserted: timing
// depends on the machine).
func testBruteForce(t *testing.T, tl *outcomeTally, figures map[string]string) {
	const renews, minGuesses = 200, 2000
	d := startUsersDaemon(t)
	m := d.mountpoint
	p := filepath.Join(m, "bf")
	holder := startProc(t, []string{"P=" + p}, nobodyArgv(t, pyRenewHolder)...)
	holder.expectKey("ready", holdTimeout)
	token := holder.expectKey("token", holdTimeout)
	st0, _ := statusDoc(t, p)
	settledSnapshot(t, d) // the new lease's record file is written behind
	hashes := recordHashes(t, d.state)

	measure := func(label string) (p50, p99 float64) {
		t.Helper()
		holder.send(fmt.Sprintf("%s %d", label, renews))
		holder.expectKey(label+"_done", 2*time.Minute)
		kv := holder.kv()
		if e := kv[label+"_errors"]; e != "0" {
			tl.violation(t, "%d of the holder's renews (%s) failed: %s", renews, label, e)
		}
		us50, _ := strconv.ParseFloat(kv[label+"_p50_us"], 64)
		us99, _ := strconv.ParseFloat(kv[label+"_p99_us"], 64)
		return us50 / 1000, us99 / 1000
	}
	idle50, idle99 := measure("idle")

	stop := filepath.Join(t.TempDir(), "stop")
	bruteStart := time.Now()
	brute := startProc(t, []string{"P=" + p, "STOP=" + stop, "MIN=" + strconv.Itoa(minGuesses)}, nobodyArgv(t, pyBruteForcer)...)
	brute.expectKey("started", holdTimeout)
	brute50, brute99 := measure("brute")
	stillRunning := brute.running()
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	brute.wait(2 * time.Minute)
	bruteTime := time.Since(bruteStart)
	bkv := brute.kv()
	tried, _ := strconv.Atoi(bkv["tried"])
	tl.add("tried", tried)
	var counts map[string]int
	if err := json.Unmarshal([]byte(bkv["counts"]), &counts); err != nil {
		t.Fatalf("brute forcer output: %v: %s", err, brute)
	}
	if counts["EACCES"] != tried || tried < minGuesses {
		tl.violation(t, "brute forcer: %d guesses, outcomes %v, want all %d refused with EACCES", tried, counts, tried)
	}
	if !stillRunning {
		t.Logf("the brute forcer finished its %d guesses before the holder's %d renews: the second measurement is only partly under load", minGuesses, renews)
	}

	// The lease is unchanged: same lease, generation, mode, holder, no annotation or
	// takeover from the guesses, same token hash; the holder's renews all succeeded.
	st1, _ := statusDoc(t, p)
	for _, k := range []string{"lease_id", "generation", "status", "mode", "holder_uid", "holder_pid", "started_at"} {
		if st1[k] != st0[k] {
			tl.violation(t, "brute force changed %s of the lease: %q → %q", k, st0[k], st1[k])
		}
	}
	for _, k := range []string{"client", "takeover_requested_by", "pid"} {
		if v, ok := st1[k]; ok {
			tl.violation(t, "brute force set %s = %q on the lease", k, v)
		}
	}
	if h := recordHashes(t, d.state); !slices.Equal(h, hashes) {
		tl.violation(t, "token hashes in the state directory changed: %v → %v", hashes, h)
	}
	if strings.Contains(d.stderr(), token) {
		tl.violation(t, "the daemon logged the holder's token")
	}
	// Every guess is counted; the log lines are limited per uid (docs/PROTOCOL.md §8b): at
	// most the burst and one a second, however fast the guesses come.
	samples, _ := scrapeMetrics(t, d.metricsURL(t))
	if n := samples[`leasefs_refusals_total{errno="EACCES",op="write"}`]; n < float64(tried) {
		t.Errorf("leasefs_refusals_total counts %v refused writes for %d wrong guesses", n, tried)
	}
	logged := len(regexp.MustCompile(`msg=refused op=write resource=bf .*errno=EACCES`).FindAllString(d.stderr(), -1))
	if most := refusal.DefaultBurst + int(bruteTime.Seconds()*refusal.DefaultPerSecond) + 1; logged < 1 || logged > most {
		t.Errorf("the daemon logged %d refused writes on bf for %d wrong guesses in %v, want 1 to %d", logged, tried, bruteTime, most)
	}

	ms := func(a, b float64) string { return fmt.Sprintf("%.2f ms / %.2f ms", a, b) }
	figures["holder renew p50/p99 idle"] = ms(idle50, idle99)
	figures["holder renew p50/p99 under brute force"] = ms(brute50, brute99)
	figures["holder renew slowdown under brute force (p50, p99)"] = fmt.Sprintf("%.2fx, %.2fx", brute50/idle50, brute99/idle99)
	t.Logf("holder renew idle %s, under brute force %s (%s guesses/s, %d tried): p50 ×%.2f, p99 ×%.2f",
		ms(idle50, idle99), ms(brute50, brute99), bkv["rate"], tried, brute50/idle50, brute99/idle99)
	holder.killGroup()
}
