package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestVersion checks that `leasefs version` prints something and exits 0.
func TestVersion(t *testing.T) {
	t.Parallel()
	r := runClient(t, nil, leasefsBin, "version")
	if r.code != 0 || strings.TrimSpace(r.stdout) == "" {
		t.Fatalf("leasefs version: %s", r)
	}
}

// TestShellReserveRenewRelease drives one lease through its whole life from bash: reserve,
// token read, status read, renew, stat, ls, rm, history.
func TestShellReserveRenewRelease(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "feature-a")
	env := "P=" + p

	if r := sh(t, `set -C; : > "$P"`, env); r.code != 0 {
		t.Fatalf("reserve with set -C; : > file: %s", r)
	}
	tok := readToken(t, p)
	st, _ := statusDoc(t, p)
	for k, want := range map[string]string{"resource": "feature-a", "status": "active", "mode": "token", "holder_uid": "0"} {
		if st[k] != want {
			t.Errorf("status %s = %q, want %q", k, st[k], want)
		}
	}
	id := st["lease_id"]
	if !leaseIDRE.MatchString(id) {
		t.Errorf("status lease_id = %q, want %s", id, leaseIDRE)
	}
	if g, err := strconv.Atoi(st["generation"]); err != nil || g <= 0 {
		t.Errorf("status generation = %q, want a positive integer", st["generation"])
	}

	if r := sh(t, `echo "$TOK" >| "$P"`, env, "TOK="+tok); r.code != 0 {
		t.Errorf("renew with echo tok >| file: %s", r)
	}
	size := strings.TrimSpace(mustSh(t, `stat -c %s "$P"`, env).stdout)
	_, doc := statusDoc(t, p)
	if size != strconv.Itoa(len(doc)) {
		t.Errorf("stat -c %%s = %s, want the status document length %d", size, len(doc))
	}
	if ls := mustSh(t, `ls -l "$M"`, "M="+d.mountpoint).stdout; !regexp.MustCompile(`(?m) feature-a$`).MatchString(ls) {
		t.Errorf("ls -l of the mount does not show feature-a:\n%s", ls)
	}
	live := findLease(cliJSON(t, "ls", "--state", d.state, "--json"), id)
	if live == nil || fmt.Sprint(live["resource"]) != "feature-a" || fmt.Sprint(live["status"]) != "active" {
		t.Errorf("leasefs ls --json: lease %s = %v, want resource feature-a, status active", id, live)
	}

	if r := sh(t, `rm "$P"`, env); r.code != 0 {
		t.Fatalf("release with rm: %s", r)
	}
	if slices.Contains(listMount(t, d.mountpoint), "feature-a") {
		t.Errorf("feature-a still listed after rm")
	}
	if r := sh(t, `test -e "$P"`, env); r.code == 0 {
		t.Errorf("feature-a still exists after rm")
	}
	h := findLease(cliJSON(t, "history", "--state", d.state, "--json"), id)
	if h == nil || fmt.Sprint(h["status"]) != "complete" || fmt.Sprint(h["resource"]) != "feature-a" {
		t.Errorf("leasefs history --json: lease %s = %v, want resource feature-a, status complete", id, h)
	}

	// Renewing after the lease ended, or with a token never issued: the
	// O_CREAT of >| reserves the free name, the write is refused with
	// ESTALE, and that reservation is released at once (PROTOCOL §3,
	// "Choices").
	for _, stale := range []string{tok, "hwl_" + strings.Repeat("a", 39)} {
		r := sh(t, `echo "$TOK" >| "$P"`, env, "TOK="+stale)
		if r.code == 0 || !strings.Contains(r.stderr, "Stale file handle") {
			t.Errorf("echo %s >| file after the lease ended: %s, want ESTALE (Stale file handle)", stale, r)
		}
		if slices.Contains(listMount(t, d.mountpoint), "feature-a") {
			t.Errorf("feature-a is held after the refused renew with %s: the reservation of >| was kept", stale)
		}
	}
	// Any other refused write through such an open releases its
	// reservation too, and a takeover finds no one to take over from.
	for _, c := range []struct{ script, want string }{
		{`echo garbage >| "$P"`, "Invalid argument"},
		{`echo >| "$P"`, "Invalid argument"},
		{`printf takeover >| "$P"`, "Stale file handle"},
		{`head -c 70000 /dev/zero | tr '\0' x | dd of="$P" bs=70000 count=1 iflag=fullblock conv=notrunc status=none`, "too large"},
	} {
		r := sh(t, c.script, env)
		if r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%s on a free name: %s, want it refused (%s)", c.script, r, c.want)
		}
		if slices.Contains(listMount(t, d.mountpoint), "feature-a") {
			t.Errorf("feature-a is held after the refused %s: the reservation of its open was kept", c.script)
		}
	}
	abandoned := 0
	for _, l := range cliJSON(t, "history", "--state", d.state, "feature-a", "--json") {
		if fmt.Sprint(l["status"]) == "abandoned" {
			abandoned++
		}
	}
	if abandoned != 6 {
		t.Errorf("history of feature-a has %d abandoned leases, want the 6 reservations of the refused writes", abandoned)
	}
}

// TestPythonProtocol drives the read/write protocol through one python3 descriptor and checks
// the errno of every refusal.
func TestPythonProtocol(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	kv := pyKV(t, `
p = os.path.join(M, "feature-py")
fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
tok = os.read(fd, 4096)
out("token", tok)
out("eof_after_token", os.read(fd, 4096))
tok = tok.decode().strip()
out("doc0", os.pread(fd, 65536, 0))
out("wrong", err(os.pwrite, fd, b"hwl_" + b"a" * 39 + b"\n", 0))
out("malformed", err(os.pwrite, fd, b"not a token at all\n", 0))
out("unknown_action", err(os.pwrite, fd, ('token = "%s"\naction = "explode"\n' % tok).encode(), 0))
out("big", err(os.pwrite, fd, b"a" * (65 * 1024), 0))
# A plain write() at the offset left by the token read: each write() is one command.
out("renew_bare", err(os.write, fd, tok.encode()))
out("doc1", os.pread(fd, 65536, 0))
out("renew_toml", err(os.pwrite, fd, ('token = "%s"\naction = "renew"\nclient = "py"\n' % tok).encode(), 0))
out("doc2", os.pread(fd, 65536, 0))
out("complete", err(os.pwrite, fd, ('token = "%s"\naction = "complete"\n' % tok).encode(), 0))
out("exists_after", os.path.exists(p))
out("write_after", err(os.pwrite, fd, (tok + "\n").encode(), 0))
out("read_after", err(os.pread, fd, 4096, 0))
os.close(fd)
`, "M="+d.mountpoint)

	if !tokenRE.MatchString(kv["token"]) {
		t.Fatalf("read on the reserving O_CREAT|O_EXCL|O_RDWR fd = %q, want a token line", kv["token"])
	}
	wantKV(t, kv, "eof_after_token", "")
	wantKV(t, kv, "wrong", "EACCES")
	wantKV(t, kv, "malformed", "EINVAL")
	wantKV(t, kv, "unknown_action", "EINVAL")
	wantKV(t, kv, "big", "EFBIG")
	wantKV(t, kv, "renew_bare", "ok")
	wantKV(t, kv, "renew_toml", "ok")
	wantKV(t, kv, "complete", "ok")
	wantKV(t, kv, "exists_after", "False")
	wantKV(t, kv, "write_after", "ESTALE")
	wantKV(t, kv, "read_after", "ESTALE")

	var docs [3]map[string]string
	for i := range docs {
		raw := kv[fmt.Sprintf("doc%d", i)]
		if strings.Contains(raw, "hwl_") {
			t.Fatalf("doc%d reveals a token:\n%s", i, raw)
		}
		docs[i] = parseStatus(t, raw)
		if docs[i]["resource"] != "feature-py" || docs[i]["status"] != "active" || docs[i]["lease_id"] != docs[0]["lease_id"] {
			t.Errorf("doc%d = %v, want the same active lease on feature-py", i, docs[i])
		}
	}
	if docs[2]["client"] != "py" {
		t.Errorf("after the TOML renew, client = %q, want \"py\"", docs[2]["client"])
	}
	if e0, e2 := statusTime(t, docs[0], "expires_at"), statusTime(t, docs[2], "expires_at"); e2.Before(e0) {
		t.Errorf("expires_at went back after renewals: %v then %v", e0, e2)
	}
	h := findLease(cliJSON(t, "history", "--state", d.state, "feature-py", "--json"), docs[0]["lease_id"])
	if h == nil || fmt.Sprint(h["status"]) != "complete" {
		t.Errorf("history after action = \"complete\": %v, want status complete", h)
	}
}

// TestTokenRevealedOnce checks that only the first read returns the token: later reads at any
// offset, by any descriptor, and the xattrs never show it.
func TestTokenRevealedOnce(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "once")
	mustSh(t, `set -C; : > "$P"`, "P="+p)
	kv := pyKV(t, `
p = os.path.join(M, "once")
def read_all(path):
    fd = os.open(path, os.O_RDONLY)
    data = b""
    while True:
        b = os.read(fd, 7)
        if not b:
            break
        data += b
    os.close(fd)
    return data
out("first", read_all(p))
out("second", read_all(p))
fd = os.open(p, os.O_RDONLY)
out("pread", b"".join(os.pread(fd, 4096, off) for off in (0, 4, 40)))
os.close(fd)
out("xattrs", b"".join(os.getxattr(p, n) for n in os.listxattr(p)))
`, "M="+d.mountpoint)
	if !tokenRE.MatchString(kv["first"]) {
		t.Fatalf("first read (7-byte reads) = %q, want a token line", kv["first"])
	}
	for _, k := range []string{"second", "pread", "xattrs"} {
		if strings.Contains(kv[k], "hwl_") {
			t.Errorf("%s reveals a token: %q", k, kv[k])
		}
	}
	if st := parseStatus(t, kv["second"]); st["resource"] != "once" {
		t.Errorf("second read is not the status document: %q", kv["second"])
	}
	if _, doc := statusDoc(t, p); doc == "" {
		t.Errorf("third read (cat) is empty")
	}
}

// TestTokenNeverStored checks that no token seen by a client appears in any file under the
// state directory or in the daemon's log, and that records are private.
func TestTokenNeverStored(t *testing.T) {
	fileStoreOnly(t, "it reads the state directory's files for tokens")
	t.Parallel()
	// At debug level: no log line of any level may hold a token.
	d := startDaemon(t, daemonOpts{extraArgs: []string{"--log-level", "debug"}})
	var toks []string
	for _, name := range []string{"s1", "s2", "s3"} {
		p := filepath.Join(d.mountpoint, name)
		tok := reserve(t, p)
		toks = append(toks, tok)
		// A multi-line command must reach the daemon in one write(): bash's echo and printf
		// write line by line, cat of a here-document writes it whole.
		mustSh(t, "echo \"$TOK\" >| \"$P\"\ncat >| \"$P\" <<EOF\ntoken = \"$TOK\"\nclient = \"c\"\nEOF", "P="+p, "TOK="+tok)
	}
	// A wrong token (another lease's) is refused and must not be logged either.
	if r := sh(t, `echo "$TOK" >| "$P"`, "P="+filepath.Join(d.mountpoint, "s1"), "TOK="+toks[1]); r.code == 0 {
		t.Errorf("writing s2's token to s1 succeeded")
	}
	mustSh(t, "cat >| \"$P\" <<EOF\ntoken = \"$TOK\"\naction = \"complete\"\nEOF\nrm \"$Q\"",
		"P="+filepath.Join(d.mountpoint, "s2"), "TOK="+toks[1], "Q="+filepath.Join(d.mountpoint, "s3"))
	// Record files are written behind while the daemon serves
	// (docs/PROTOCOL.md §4.3); a clean stop writes every one.
	d.stop(true)

	if fi, err := os.Stat(d.state); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state directory: %v, %v; want mode 0700", fi.Mode(), err)
	}
	hashRE := regexp.MustCompile(`(?m)^token_hash\s*=\s*"[0-9a-f]{64}"$`)
	records := 0
	err := filepath.WalkDir(d.state, func(path string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(data, []byte("hwl_")) {
			t.Errorf("%s contains a token (hwl_)", path)
		}
		for _, tok := range toks {
			if bytes.Contains(data, []byte(tok[4:])) {
				t.Errorf("%s contains the body of token %s…", path, tok[:8])
			}
		}
		if filepath.Base(filepath.Dir(path)) == "writer-leases" && strings.HasSuffix(path, ".toml") {
			records++
			if !hashRE.Match(data) {
				t.Errorf("%s has no token_hash of 64 hex digits:\n%s", path, data)
			}
			if fi, _ := e.Info(); fi != nil && fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: mode %v, want 0600", path, fi.Mode().Perm())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk state: %v", err)
	}
	if records < 3 {
		t.Errorf("found %d records under %s/writer-leases, want 3", records, d.state)
	}
	if strings.Contains(d.stderr(), "hwl_") {
		t.Errorf("daemon log contains a token:\n%s", d.stderr())
	}
}

// TestRefusals checks the operations leasefs refuses or accepts as no-ops, name validation and
// the xattr interface.
func TestRefusals(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "held")
	reserve(t, p)
	before, _ := statusDoc(t, p)

	kv := pyKV(t, `
import stat
p = os.path.join(M, "held")
q = os.path.join(M, "other")
out("rename", err(os.rename, p, q))
out("link", err(os.link, p, q))
out("symlink", err(os.symlink, "held", q))
out("mknod", err(os.mknod, q, 0o644 | stat.S_IFIFO))
out("chmod", err(os.chmod, p, 0o600))
out("chown", err(os.chown, p, 1, 1))
out("other_exists", os.path.lexists(q))
excl = os.O_CREAT | os.O_EXCL | os.O_WRONLY
out("name256", err(os.open, os.path.join(M, "a" * 256), excl, 0o644))
fd, res = call(os.open, os.path.join(M, "b" * 255), excl, 0o644)
out("name255", res)
if fd is not None:
    os.close(fd)
    out("unlink255", err(os.unlink, os.path.join(M, "b" * 255)))
out("badutf8", err(os.open, os.fsencode(M) + b"/bad\xff", excl, 0o644))
out("xstatus", os.getxattr(p, "user.lease.status"))
out("xresource", os.getxattr(p, "user.lease.resource"))
out("xunknown", err(os.getxattr, p, "user.lease.nope"))
out("xlist", json.dumps(os.listxattr(p)))
out("xsetdir", err(os.setxattr, M, "user.lease.status", b"complete"))
out("xremovedir", err(os.removexattr, M, "user.lease.status"))
`, "M="+d.mountpoint)
	for _, k := range []string{"rename", "link", "symlink", "mknod", "chmod", "chown"} {
		wantKV(t, kv, k, "EPERM")
	}
	wantKV(t, kv, "other_exists", "False")
	wantKV(t, kv, "name256", "ENAMETOOLONG")
	wantKV(t, kv, "name255", "ok")
	wantKV(t, kv, "unlink255", "ok")
	wantKV(t, kv, "badutf8", "EINVAL")
	wantKV(t, kv, "xstatus", "active")
	wantKV(t, kv, "xresource", "held")
	wantKV(t, kv, "xunknown", "ENODATA")
	wantKV(t, kv, "xsetdir", "EPERM")
	wantKV(t, kv, "xremovedir", "EPERM")
	var names []string
	if err := json.Unmarshal([]byte(kv["xlist"]), &names); err != nil || !slices.Contains(names, "user.lease.resource") {
		t.Errorf("listxattr = %s, want it to include user.lease.resource", kv["xlist"])
	}

	if r := sh(t, `touch "$P"`, "P="+p); r.code != 0 {
		t.Errorf("touch by the holder: %s", r)
	}
	if r := sh(t, `: > "$P"`, "P="+p); r.code != 0 {
		t.Errorf(": > file (O_TRUNC) by the holder: %s", r)
	}
	after, _ := statusDoc(t, p)
	if after["lease_id"] != before["lease_id"] || after["status"] != "active" {
		t.Errorf("after refusals, touch and O_TRUNC the lease is %v, want still %s active", after, before["lease_id"])
	}
}
