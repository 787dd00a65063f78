package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasefs/leasefs/internal/testenv"
)

// startSharedDaemon starts a daemon with --allow-other whose mountpoint uid 65534 can reach,
// and checks that nobody can run python3 and stat the mount root.
func startSharedDaemon(t *testing.T) *daemon {
	t.Helper()
	testenv.RequireFUSE(t)
	mp := t.TempDir()
	// t.TempDir's per-test parent is 0700; nobody must be able to walk to the mountpoint.
	if err := os.Chmod(filepath.Dir(mp), 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, daemonOpts{mountpoint: mp, allowOther: true})
	kv := pyAsNobody(t, `
out("uid", os.getuid())
out("root_mode", oct(os.stat(M).st_mode & 0o7777))
`, "M="+d.mountpoint)
	wantKV(t, kv, "uid", "65534")
	wantKV(t, kv, "root_mode", "0o1777")
	return d
}

// TestOtherUID checks per-uid access with --allow-other: another uid sees status documents but
// cannot write, unlink or read the token of root's lease, and can reserve and read its own.
func TestOtherUID(t *testing.T) {
	t.Parallel()
	d := startSharedDaemon(t)
	m := d.mountpoint
	tok := reserve(t, filepath.Join(m, "rootlease"))
	mustSh(t, `set -C; : > "$P"`, "P="+filepath.Join(m, "unread")) // token not read yet

	kv := pyAsNobody(t, `
p = os.path.join(M, "rootlease")
fd, res = call(os.open, p, os.O_RDONLY)
out("open_read", res)
if fd is not None:
    out("doc", os.read(fd, 65536))
    os.close(fd)
# Even with the right token, a write by a uid that is not the holder is refused.
fd, res = call(os.open, p, os.O_WRONLY)
if fd is not None:
    res = err(os.write, fd, (os.environ["TOK"] + "\n").encode())
    os.close(fd)
out("write", res)
out("unlink", err(os.unlink, p))
fd, res = call(os.open, os.path.join(M, "unread"), os.O_RDONLY)
out("unread", os.read(fd, 65536) if fd is not None else res)
own = os.path.join(M, "nobody-lease")
fd, res = call(os.open, own, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
out("reserve_own", res)
if fd is not None:
    out("own_token", os.read(fd, 4096))
    out("own_uid", os.fstat(fd).st_uid)
    os.close(fd)
`, "M="+m, "TOK="+tok)
	wantKV(t, kv, "open_read", "ok")
	if st := parseStatus(t, kv["doc"]); st["resource"] != "rootlease" || strings.Contains(kv["doc"], "hwl_") {
		t.Errorf("nobody's read of root's lease = %q, want the status document", kv["doc"])
	}
	wantKV(t, kv, "write", "EACCES")
	wantKV(t, kv, "unlink", "EPERM")
	if strings.Contains(kv["unread"], "hwl_") {
		t.Errorf("nobody read the unread token of root's lease")
	}
	wantKV(t, kv, "reserve_own", "ok")
	wantKV(t, kv, "own_uid", "65534")
	if !tokenRE.MatchString(kv["own_token"]) {
		t.Errorf("nobody's first read of its own lease = %q, want a token", kv["own_token"])
	}

	// Root's leases are intact, and nobody's read did not burn root's unread token.
	if st, _ := statusDoc(t, filepath.Join(m, "rootlease")); st["status"] != "active" {
		t.Errorf("root's lease after nobody's attempts: %v", st)
	}
	readToken(t, filepath.Join(m, "unread"))
	if st, _ := statusDoc(t, filepath.Join(m, "nobody-lease")); st["holder_uid"] != "65534" {
		t.Errorf("nobody's lease holder_uid = %q, want 65534", st["holder_uid"])
	}
	if r := sh(t, `rm "$P"`, "P="+filepath.Join(m, "nobody-lease")); r.code != 0 {
		t.Errorf("root could not release nobody's lease: %s", r)
	}

	// Namespaces.
	ns := filepath.Join(m, "ns")
	if r := sh(t, `mkdir "$D" && set -C && : > "$D/x"`, "D="+ns); r.code != 0 {
		t.Fatalf("mkdir ns and reserve ns/x: %s", r)
	}
	readToken(t, filepath.Join(ns, "x"))
	if st, _ := statusDoc(t, filepath.Join(ns, "x")); st["resource"] != "ns/x" {
		t.Errorf("resource of ns/x = %q, want \"ns/x\"", st["resource"])
	}
	kv = pyKV(t, `out("rmdir", err(os.rmdir, os.path.join(M, "ns")))`, "M="+m)
	wantKV(t, kv, "rmdir", "ENOTEMPTY")
}

// TestQuota checks --max-leases-per-uid: a create beyond the limit fails with EDQUOT and
// succeeds again once a lease is released.
func TestQuota(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{maxLeasesPerUID: 2})
	kv := pyKV(t, `
excl = os.O_CREAT | os.O_EXCL | os.O_WRONLY
for name in ("q1", "q2", "q3"):
    fd, res = call(os.open, os.path.join(M, name), excl, 0o644)
    out(name, res)
    if fd is not None:
        os.close(fd)
out("q3_exists", os.path.exists(os.path.join(M, "q3")))
os.unlink(os.path.join(M, "q1"))
fd, res = call(os.open, os.path.join(M, "q3"), excl, 0o644)
out("q3_after_release", res)
`, "M="+d.mountpoint)
	wantKV(t, kv, "q1", "ok")
	wantKV(t, kv, "q2", "ok")
	wantKV(t, kv, "q3", "EDQUOT")
	wantKV(t, kv, "q3_exists", "False")
	wantKV(t, kv, "q3_after_release", "ok")
}
