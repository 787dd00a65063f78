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
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/internal/testenv"
)

// Disk faults: the state directory sits on a small tmpfs under a running
// daemon, which the tests fill to ENOSPC or make read-only. Every change must then fail with
// ENOSPC or EIO from the syscall itself and change nothing, on disk or in what the mount
// shows; reads must keep working; and everything must work again once the fault is gone.

// outcomeTally counts what a reliability test checked, by name; a parent test records the
// totals as report figures once its subtests are done. Safe for concurrent use.
type outcomeTally struct {
	mu sync.Mutex
	n  map[string]int
}

func newOutcomeTally() *outcomeTally { return &outcomeTally{n: map[string]int{}} }

// add adds n to the count of key.
func (c *outcomeTally) add(key string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[key] += n
}

// get returns the count of key.
func (c *outcomeTally) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// violation counts an outcome that breaks the contract and reports it as a test error.
func (c *outcomeTally) violation(t testing.TB, format string, args ...any) {
	t.Helper()
	c.add("violations", 1)
	t.Errorf("VIOLATION: "+format, args...)
}

// diskFS is a small tmpfs holding one daemon's state directory, so that a test can fill it
// (ENOSPC) or make it read-only under the running daemon. Cleanup unmounts it (lazily when
// busy), with whatever is stacked on it.
type diskFS struct {
	t      *testing.T
	dir    string // the tmpfs mountpoint
	filler string // the file that fills it
	// sbReadOnly: the last setReadOnly(true) remounted the filesystem itself read-only;
	// otherwise a read-only bind mount is stacked on dir.
	sbReadOnly bool
	bound      bool // a bind mount of dir is stacked on dir
	// sbRemountErr is what `mount -o remount,ro` of the filesystem answered.
	sbRemountErr error
}

// mountDiskFS mounts a tmpfs of size (e.g. "2m") in a new t.TempDir().
func mountDiskFS(t *testing.T, size string) *diskFS {
	t.Helper()
	testenv.RequireFUSE(t) // root, which mount(2) needs too
	dir := t.TempDir()
	if err := unix.Mount("leasefs-test-state", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+size+",mode=0755"); err != nil {
		testenv.SkipOrFail(t, "mount a tmpfs for the state directory: %v", err)
	}
	// Registered before the daemon's cleanup, so it runs after the daemon has stopped.
	t.Cleanup(func() { unmountAllLazily(t, dir) })
	return &diskFS{t: t, dir: dir, filler: filepath.Join(dir, "filler")}
}

// unmountAllLazily unmounts every mount stacked on dir, detaching a busy one.
func unmountAllLazily(t testing.TB, dir string) {
	t.Helper()
	for range 8 {
		err := unix.Unmount(dir, 0)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(dir, unix.MNT_DETACH)
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return // not a mountpoint any more
		}
		if err != nil {
			t.Errorf("unmount %s: %v", dir, err)
			return
		}
	}
}

// fill writes the filler file until the filesystem answers ENOSPC, in ever smaller chunks so
// that not one byte is left, and checks that statfs reports no free block.
func (f *diskFS) fill() {
	f.t.Helper()
	fh, err := os.OpenFile(f.filler, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		f.t.Fatalf("create filler: %v", err)
	}
	defer fh.Close()
	buf := make([]byte, 1<<16)
	for _, size := range []int{1 << 16, 4096, 1} {
		for {
			_, err := fh.Write(buf[:size])
			if errors.Is(err, unix.ENOSPC) {
				break
			}
			if err != nil {
				f.t.Fatalf("fill %s: %v", f.dir, err)
			}
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(f.dir, &st); err != nil {
		f.t.Fatalf("statfs %s: %v", f.dir, err)
	}
	if st.Bavail != 0 {
		f.t.Fatalf("%s still has %d free blocks after filling", f.dir, st.Bavail)
	}
}

// free deletes the filler.
func (f *diskFS) free() {
	f.t.Helper()
	if err := os.Remove(f.filler); err != nil {
		f.t.Fatalf("remove filler: %v", err)
	}
}

// setReadOnly makes the filesystem read-only (ro) or writable again. It first tries what an
// administrator would type, `mount -o remount,ro` of the filesystem; the kernel refuses that
// with EBUSY while a process (the daemon) holds a file on it open for writing, and then a
// read-only bind mount stacked on the tmpfs mountpoint makes every path the daemon resolves
// read-only instead (EROFS), as an emergency read-only remount by the kernel would.
func (f *diskFS) setReadOnly(ro bool) {
	f.t.Helper()
	if !ro {
		flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND)
		if f.sbReadOnly {
			flags = unix.MS_REMOUNT
		}
		if err := unix.Mount("", f.dir, "", flags, ""); err != nil {
			f.t.Fatalf("remount %s read-write: %v", f.dir, err)
		}
		f.sbReadOnly = false
		return
	}
	if !f.bound {
		f.sbRemountErr = unix.Mount("", f.dir, "", unix.MS_REMOUNT|unix.MS_RDONLY, "")
		if f.sbRemountErr == nil {
			f.sbReadOnly = true
			return
		}
		if !errors.Is(f.sbRemountErr, unix.EBUSY) {
			f.t.Fatalf("mount -o remount,ro %s: %v", f.dir, f.sbRemountErr)
		}
		if err := unix.Mount(f.dir, f.dir, "", unix.MS_BIND, ""); err != nil {
			f.t.Fatalf("bind mount %s on itself: %v", f.dir, err)
		}
		f.bound = true
	}
	if err := unix.Mount("", f.dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		f.t.Fatalf("remount the bind mount of %s read-only: %v", f.dir, err)
	}
}

// stateSnapshot returns the contents of every file of the state directory that holds lease
// state (records, temporary files, namespaces, generation, spares written into), by path
// relative to state. It reads under the shared store lock (writer-leases/.lock), as every
// reader of the records does (docs/PROTOCOL.md §4.3), so that a serving daemon neither
// exchanges a record nor reuses a spare meanwhile; an empty spare its spare maker discards
// meanwhile is skipped like the others.
func stateSnapshot(t testing.TB, state string) map[string]string {
	t.Helper()
	defer lockStoreShared(t, state)()
	snap := map[string]string{}
	for _, dir := range []string{state, filepath.Join(state, relLeasesDir)} {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatalf("list %s: %v", dir, err)
		}
		for _, e := range entries {
			if e.IsDir() || e.Name() == "filler" || strings.HasPrefix(e.Name(), "leasefs.lock") {
				continue
			}
			p := filepath.Join(dir, e.Name())
			spare := strings.HasPrefix(e.Name(), ".free-")
			data, err := os.ReadFile(p)
			if spare && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				t.Fatalf("read %s: %v", p, err)
			}
			if spare && len(data) == 0 {
				// An empty spare holds no lease state, and the daemon's
				// spare maker adds them in the background whenever the
				// stock runs low (docs/PROTOCOL.md §4.3); a spare written
				// into by a refused change is not empty and is compared.
				continue
			}
			rel, _ := filepath.Rel(state, p)
			snap[rel] = string(data)
		}
	}
	return snap
}

// lockStoreShared takes the shared store lock of state (flock LOCK_SH on
// writer-leases/.lock, docs/PROTOCOL.md §4.3), as every reader of the records does, and
// returns its release. While it is held a serving daemon writes no record, and the files
// beside the records change only by its spare maker adding empty spares. A state directory
// without the lock file (no daemon ever served it) is read without it.
func lockStoreShared(t testing.TB, state string) (unlock func()) {
	t.Helper()
	lock, err := os.Open(filepath.Join(state, relLeasesDir, ".lock"))
	if err != nil {
		return func() {}
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_SH); err != nil {
		lock.Close()
		t.Fatalf("flock LOCK_SH %s: %v", lock.Name(), err)
	}
	return func() { lock.Close() }
}

// settledSnapshot returns a [stateSnapshot] of d's state directory once the daemon has
// written every record behind its journal entry (docs/PROTOCOL.md §4.3: within 100 ms, or
// once the disk accepts writes again), as its leasefs_store_lagging_records metric says, and
// the directory has stopped changing: two snapshots half a second apart are equal (the
// blocked-waiters file is rewritten behind too). d must have been started with a
// metricsAddr.
func settledSnapshot(t testing.TB, d *daemon) map[string]string {
	t.Helper()
	url := d.metricsURL(t)
	deadline := time.Now().Add(30 * time.Second)
	var snap map[string]string
	for {
		waitMetrics(t, url, "the daemon has written every record behind its journal",
			map[string]float64{"leasefs_store_lagging_records": 0})
		next := stateSnapshot(t, d.state)
		if snap != nil && diffSnapshots(snap, next) == "" {
			return next
		}
		if snap != nil && time.Now().After(deadline) {
			t.Fatalf("the state directory %s keeps changing with no call made:\n%s", d.state, diffSnapshots(snap, next))
		}
		snap = next
		time.Sleep(500 * time.Millisecond)
	}
}

// diffSnapshots describes how two [stateSnapshot]s differ ("" when equal).
func diffSnapshots(before, after map[string]string) string {
	var diffs []string
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if v, ok := after[k]; !ok {
			diffs = append(diffs, "removed "+k)
		} else if v != before[k] {
			diffs = append(diffs, fmt.Sprintf("changed %s:\n%s\n---\n%s", k, before[k], v))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if _, ok := before[k]; !ok {
			diffs = append(diffs, "added "+k)
		}
	}
	return strings.Join(diffs, "\n")
}

// pyStateAudit parses every record and the namespaces file of the state directory $S with
// tomllib and reports problems: unparsable TOML, a lease_id that does not match the file
// name, an unknown status, leftover temporary files, and any file containing a token.
const pyStateAudit = `
import tomllib
S = os.environ["S"]
problems = []
n = 0
for d in (S, os.path.join(S, "writer-leases")):
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        if os.path.isdir(p) or name == "filler":
            continue
        if name.startswith((".lease-", ".namespaces.toml", ".generation")):
            problems.append("leftover temporary file " + p)
            continue
        data = open(p, "rb").read()
        if b"hwl_" in data:
            problems.append("token in " + p)
        if not name.endswith(".toml"):
            continue
        n += 1
        try:
            doc = tomllib.loads(data.decode())
        except Exception as x:
            problems.append("%s does not parse: %s" % (p, x))
            continue
        if d != S:
            if doc.get("lease_id") + ".toml" != name:
                problems.append("%s has lease_id %r" % (p, doc.get("lease_id")))
            if doc.get("status") not in ("active", "complete", "abandoned"):
                problems.append("%s has status %r" % (p, doc.get("status")))
out("parsed", n)
out("problems", json.dumps(problems))
`

// auditState runs [pyStateAudit] on state, under its shared store lock, and counts every
// problem as a violation.
func auditState(t testing.TB, tl *outcomeTally, state, when string) {
	t.Helper()
	// Under the shared store lock, as every reader of the records: a
	// serving daemon renames spares into records (and discards them) under
	// the exclusive one, so without it a listed spare can vanish before
	// the audit opens it.
	unlock := lockStoreShared(t, state)
	kv := pyKV(t, pyStateAudit, "S="+state)
	unlock()
	var problems []string
	if err := json.Unmarshal([]byte(kv["problems"]), &problems); err != nil {
		t.Fatalf("state audit output %v: %v", kv, err)
	}
	for _, p := range problems {
		tl.violation(t, "state directory %s: %s", when, p)
	}
	if kv["parsed"] == "0" {
		t.Errorf("state audit %s parsed no TOML file", when)
	}
}

// refusedLines counts the daemon's "refused" log lines with errno ENOSPC or EIO.
func refusedLines(d *daemon) int {
	return len(regexp.MustCompile(`msg=refused .*errno=(ENOSPC|EIO)`).FindAllString(d.stderr(), -1))
}

// pyDiskDriver is a python3 client that sets up leases and namespaces in the mount $M, then
// obeys stdin lines "fault N" (every kind of change, each expected to fail, then reads) and
// "recover N" (the same changes, each expected to succeed, leaving the same layout behind).
// The layout: namespaces keep/ and empty/, token lease held (its token read, its reserving
// descriptor kept for renewals), keep/inner (token read), bindme (its reserving descriptor
// kept: a flock binds it), and an open descriptor of flockme whose lease has ended (a flock
// reserves the name anew).
const pyDiskDriver = `
import fcntl
EX_NB = fcntl.LOCK_EX | fcntl.LOCK_NB
excl = os.O_CREAT | os.O_EXCL
def P(*a):
    return os.path.join(M, *a)
def reserve(name):
    return os.open(P(name), excl | os.O_RDWR, 0o644)
def complete(tok):
    return ('token = "%s"\naction = "complete"\n' % tok).encode()
def ended_descriptor():
    fd = reserve("flockme")
    other = os.open(P("flockme"), os.O_RDONLY)
    os.unlink(P("flockme"))
    os.close(fd)
    return other

os.mkdir(P("keep"))
os.mkdir(P("empty"))
held = reserve("held")
tok = os.read(held, 4096).decode().strip()
fd = reserve("keep/inner")
os.read(fd, 4096)
os.close(fd)
bind = reserve("bindme")
fl = ended_descriptor()
out("token", tok)
out("setup", "ok")

for line in sys.stdin:
    cmd, n = line.split()
    r = {}
    if cmd == "fault":
        fd, r["create"] = call(os.open, P("new" + n), excl | os.O_RDWR, 0o644)
        if fd is not None:
            os.close(fd)
        fd, r["create_noexcl"] = call(os.open, P("new%sb" % n), os.O_CREAT | os.O_WRONLY, 0o644)
        if fd is not None:
            os.close(fd)
        r["renew"] = err(os.write, held, (tok + "\n").encode())
        r["renew_toml"] = err(os.write, held, ('token = "%s"\nclient = "fault-%s"\n' % (tok, n)).encode())
        r["takeover"] = err(os.write, held, b"takeover")
        r["complete"] = err(os.write, held, complete(tok))
        r["unlink"] = err(os.unlink, P("held"))
        r["unlink_ns"] = err(os.unlink, P("keep", "inner"))
        r["mkdir"] = err(os.mkdir, P("ns" + n))
        r["rmdir"] = err(os.rmdir, P("empty"))
        r["flock_bind"] = err(fcntl.flock, bind, EX_NB)
        r["flock_reserve"] = err(fcntl.flock, fl, EX_NB)
        out("ops" + n, json.dumps(r))
        rd = {}
        fd, rd["open"] = call(os.open, P("held"), os.O_RDONLY)
        doc = b""
        if fd is not None:
            doc, rd["read"] = call(os.pread, fd, 65536, 0)
            os.close(fd)
        out("doc" + n, doc or b"")
        ls, rd["ls"] = call(os.listdir, M)
        lsk, rd["ls_keep"] = call(os.listdir, P("keep"))
        rd["stat"] = err(os.stat, P("held"))
        rd["stat_inner"] = err(os.stat, P("keep", "inner"))
        x, rd["getxattr"] = call(os.getxattr, P("held"), "user.lease.status")
        out("reads" + n, json.dumps(rd))
        out("listing" + n, json.dumps(sorted(ls or []) + sorted("keep/" + x for x in (lsk or []))))
    elif cmd == "recover":
        r["renew"] = err(os.write, held, (tok + "\n").encode())
        r["renew_toml"] = err(os.write, held, ('token = "%s"\nclient = "after-%s"\n' % (tok, n)).encode())
        r["takeover"] = err(os.write, held, b"takeover")
        fd, r["create"] = call(os.open, P("new" + n), excl | os.O_RDWR, 0o644)
        if fd is not None:
            t2 = os.read(fd, 4096).decode().strip()
            r["complete"] = err(os.write, fd, complete(t2))
            os.close(fd)
        fd, r["create_noexcl"] = call(os.open, P("new%sb" % n), os.O_CREAT | os.O_WRONLY, 0o644)
        if fd is not None:
            os.close(fd)
        r["unlink"] = err(os.unlink, P("new%sb" % n))
        r["unlink_ns"] = err(os.unlink, P("keep", "inner"))
        fd, r["create_ns"] = call(reserve, "keep/inner")
        if fd is not None:
            os.read(fd, 4096)
            os.close(fd)
        r["mkdir"] = err(os.mkdir, P("ns" + n))
        r["rmdir"] = err(os.rmdir, P("ns" + n))
        r["rmdir_empty"] = err(os.rmdir, P("empty"))
        r["mkdir_empty"] = err(os.mkdir, P("empty"))
        r["flock_bind"] = err(fcntl.flock, bind, EX_NB)
        r["unlock_bind"] = err(fcntl.flock, bind, fcntl.LOCK_UN)
        os.close(bind)
        bind, r["reserve_bind"] = call(reserve, "bindme")
        r["flock_reserve"] = err(fcntl.flock, fl, EX_NB)
        r["unlock_reserve"] = err(fcntl.flock, fl, fcntl.LOCK_UN)
        out("fixed" + n, json.dumps(r))
        out("fixed_listing" + n, json.dumps(sorted(os.listdir(M)) + sorted("keep/" + x for x in os.listdir(P("keep")))))
`

// diskFault is one way of breaking the state filesystem and repairing it.
type diskFault struct {
	name   string
	inject func()
	clear  func()
}

// runDiskFaultRounds drives [pyDiskDriver] through rounds of inject → every change refused →
// reads served → nothing changed on disk → clear → every change accepted, auditing the state
// directory after each round.
func runDiskFaultRounds(t *testing.T, tl *outcomeTally, fs *diskFS, fault diskFault, rounds int) {
	d := startDaemon(t, daemonOpts{state: filepath.Join(fs.dir, "state"), metricsAddr: "127.0.0.1:0"})
	m := d.mountpoint
	drv := startPy(t, pyDiskDriver, "M="+m)
	drv.expectKey("setup", clientTimeout)
	token := drv.expectKey("token", clientTimeout)
	errnoSeen := map[string]int{}

	for round := 1; round <= rounds; round++ {
		n := fmt.Sprint(round)
		before := settledSnapshot(t, d)
		_, docBefore := statusDoc(t, filepath.Join(m, "held"))
		listBefore := cliJSON(t, "ls", "--state", d.state, "--json")
		refusedBefore := refusedLines(d)

		fault.inject()
		tl.add("faults", 1)
		drv.send("fault " + n)
		var ops, reads map[string]string
		var listing []string
		for key, dst := range map[string]any{"ops" + n: &ops, "reads" + n: &reads, "listing" + n: &listing} {
			if err := json.Unmarshal([]byte(drv.expectKey(key, clientTimeout)), dst); err != nil {
				t.Fatalf("%s: %v", key, err)
			}
		}
		for _, op := range slices.Sorted(maps.Keys(ops)) {
			got := ops[op]
			errnoSeen[got]++
			if got == "ENOSPC" || got == "EIO" {
				tl.add("refusals", 1)
				continue
			}
			tl.violation(t, "%s round %d: %s answered %s, want ENOSPC or EIO", fault.name, round, op, got)
		}
		for _, read := range slices.Sorted(maps.Keys(reads)) {
			if got := reads[read]; got != "ok" {
				tl.violation(t, "%s round %d: read %s answered %s while the disk is broken, want ok", fault.name, round, read, got)
			}
		}
		wantListing := []string{"bindme", "empty", "held", "keep", "keep/inner"}
		if !slices.Equal(listing, wantListing) {
			tl.violation(t, "%s round %d: listing while broken = %v, want %v", fault.name, round, listing, wantListing)
		}
		if doc := drv.kv()["doc"+n]; doc != docBefore {
			tl.violation(t, "%s round %d: status of held while broken:\n%s\nwant unchanged:\n%s", fault.name, round, doc, docBefore)
		}
		if diff := diffSnapshots(before, stateSnapshot(t, d.state)); diff != "" {
			tl.violation(t, "%s round %d: refused changes changed the state directory:\n%s", fault.name, round, diff)
		}
		listDuring := cliJSON(t, "ls", "--state", d.state, "--json")
		if !sameLeases(listBefore, listDuring) {
			tl.violation(t, "%s round %d: `leasefs ls` while broken = %v, want %v", fault.name, round, listDuring, listBefore)
		}
		if got, want := refusedLines(d)-refusedBefore, len(ops); got < want {
			t.Errorf("%s round %d: the daemon logged %d refusals with ENOSPC/EIO for %d refused syscalls", fault.name, round, got, want)
		}
		auditState(t, tl, d.state, fmt.Sprintf("with %s, round %d", fault.name, round))

		fault.clear()
		drv.send("recover " + n)
		if err := json.Unmarshal([]byte(drv.expectKey("fixed"+n, clientTimeout)), &ops); err != nil {
			t.Fatal(err)
		}
		for _, op := range slices.Sorted(maps.Keys(ops)) {
			if got := ops[op]; got != "ok" {
				tl.violation(t, "%s round %d: after repair, %s answered %s, want ok", fault.name, round, op, got)
			}
		}
		if err := json.Unmarshal([]byte(drv.expectKey("fixed_listing"+n, clientTimeout)), &listing); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(listing, wantListing) {
			tl.violation(t, "%s round %d: listing after repair = %v, want %v", fault.name, round, listing, wantListing)
		}
		st, _ := statusDoc(t, filepath.Join(m, "held"))
		if st["client"] != "after-"+n || st["takeover_requested_by"] == "" {
			tl.violation(t, "%s round %d: held after the repaired renewals = %v, want client after-%s and a takeover request", fault.name, round, st, n)
		}
		auditState(t, tl, d.state, fmt.Sprintf("after repairing %s, round %d", fault.name, round))
	}
	if strings.Contains(d.stderr(), token) {
		tl.violation(t, "the daemon logged a token")
	}
	t.Logf("%s: errnos of the refused changes: %v", fault.name, errnoSeen)
	drv.killGroup()
}

// sameLeases reports whether two `leasefs ls --json` listings show the same leases with the
// same heartbeats.
func sameLeases(a, b []map[string]any) bool {
	key := func(l []map[string]any) []string {
		var out []string
		for _, e := range l {
			out = append(out, fmt.Sprint(e["lease_id"], " ", e["resource"], " ", e["heartbeat_at"], " ", e["mode"]))
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(key(a), key(b))
}

// TestReliabilityDisk injects disk faults under a running daemon: a full state filesystem
// (ENOSPC), a read-only one (EROFS, which the daemon answers as EIO), an expiry and handle
// releases that happen while the disk is full. It records the faults injected, the changes
// refused with ENOSPC/EIO and the violations found.
func TestReliabilityDisk(t *testing.T) {
	t.Parallel()
	testenv.RequireFUSE(t)
	tl := newOutcomeTally()
	t.Cleanup(func() {
		recordFigure("disk faults", "faults injected", tl.get("faults"))
		recordFigure("disk faults", "refusals with ENOSPC/EIO", tl.get("refusals"))
		recordFigure("disk faults", "violations", tl.get("violations"))
	})

	t.Run("full", func(t *testing.T) {
		t.Parallel()
		fs := mountDiskFS(t, "2m")
		runDiskFaultRounds(t, tl, fs, diskFault{name: "a full disk", inject: fs.fill, clear: fs.free}, 3)
	})

	t.Run("read-only", func(t *testing.T) {
		t.Parallel()
		fs := mountDiskFS(t, "2m")
		runDiskFaultRounds(t, tl, fs, diskFault{
			name:   "a read-only state filesystem",
			inject: func() { fs.setReadOnly(true) },
			clear:  func() { fs.setReadOnly(false) },
		}, 3)
		t.Logf("mount -o remount,ro of the state filesystem under the daemon: %v", fs.sbRemountErr)
	})

	t.Run("expiry while full", func(t *testing.T) {
		t.Parallel()
		testExpiryWhileFull(t, tl)
	})

	t.Run("handle release while full", func(t *testing.T) {
		t.Parallel()
		testHandleReleaseWhileFull(t, tl)
	})
}

// testExpiryWhileFull lets a token lease expire while the disk is full: the daemon cannot
// record its end, yet listings and lookups must keep working and must not show it, and once
// space is back the lease is ended as abandoned.
func testExpiryWhileFull(t *testing.T, tl *outcomeTally) {
	const ttl = 2 * time.Second
	fs := mountDiskFS(t, "2m")
	d := startDaemon(t, daemonOpts{state: filepath.Join(fs.dir, "state"), leaseDuration: ttl, metricsAddr: "127.0.0.1:0"})
	m := d.mountpoint
	holder := startPy(t, pyFlockHolder, "P="+filepath.Join(m, "stay"))
	holder.expectKey("held", holdTimeout)
	reserved := time.Now()
	reserve(t, filepath.Join(m, "exp"))
	expID := func() string { st, _ := statusDoc(t, filepath.Join(m, "exp")); return st["lease_id"] }()
	// The records are written behind their journal entries: let them reach their files
	// before the disk fills, so that the audit below has records to parse.
	settledSnapshot(t, d)

	fs.fill()
	tl.add("faults", 1)
	time.Sleep(time.Until(reserved.Add(ttl + 500*time.Millisecond)))
	kv := pyKV(t, `
ls, r = call(os.listdir, M)
out("ls", r)
out("names", json.dumps(sorted(ls or [])))
out("stat_exp", err(os.stat, os.path.join(M, "exp")))
fd, r = call(os.open, os.path.join(M, "stay"), os.O_RDONLY)
out("cat_stay", r if fd is None else ("ok" if b"lease_id" in os.read(fd, 65536) else "no status"))
fd, r = call(os.open, os.path.join(M, "exp"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
out("create_exp", r)
`, "M="+m)
	if kv["ls"] != "ok" || kv["names"] != `["stay"]` {
		tl.violation(t, "ls of the mount after a lease expired on a full disk: %s %s, want ok [\"stay\"]", kv["ls"], kv["names"])
	}
	if kv["stat_exp"] != "ENOENT" {
		tl.violation(t, "stat of a lease that expired on a full disk: %s, want ENOENT", kv["stat_exp"])
	}
	if kv["cat_stay"] != "ok" {
		tl.violation(t, "cat of a live lease while another expired on a full disk: %s, want ok", kv["cat_stay"])
	}
	switch kv["create_exp"] {
	case "ENOSPC", "EIO":
		tl.add("refusals", 1)
	default:
		tl.violation(t, "create of an expired name on a full disk: %s, want ENOSPC or EIO", kv["create_exp"])
	}
	auditState(t, tl, d.state, "after an expiry on a full disk")

	fs.free()
	// The daemon ended the lease in memory while the disk was full; the reaper writes
	// its record once space is back.
	eventually(t, 5*time.Second, "the expired lease's record is written once space is back", func() (bool, string) {
		h := findLease(cliJSON(t, "history", "--state", d.state, "exp", "--json"), expID)
		return h != nil && fmt.Sprint(h["status"]) == "abandoned", fmt.Sprint(h)
	})
	if r := sh(t, `ls -A "$M"`, "M="+m); r.code != 0 || !slices.Equal(strings.Fields(r.stdout), []string{"stay"}) {
		tl.violation(t, "ls of the mount once space is back: %s, want only stay", r)
	}
	reserve(t, filepath.Join(m, "exp"))
	auditState(t, tl, d.state, "after space is back")
}

// pyUnlockingHolder reserves $P, flocks it, reports out("held", pid), and on the stdin line
// "unlock" unlocks (LOCK_UN) and reports out("unlock", errno name), then waits for stdin to
// close.
const pyUnlockingHolder = `
import fcntl
fd = os.open(os.environ["P"], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
out("held", os.getpid())
sys.stdin.readline()
out("unlock", err(fcntl.flock, fd, fcntl.LOCK_UN))
sys.stdin.read()
`

// testHandleReleaseWhileFull releases handle leases while the disk is full, once by the
// holder's death (the kernel's RELEASE, which cannot report an error to anyone) and once by
// LOCK_UN. A handle lease must not outlive its lock: LOCK_UN either fails (the holder still
// holds it and knows) or ends the lease, and once space is back both names must be free.
func testHandleReleaseWhileFull(t *testing.T, tl *outcomeTally) {
	fs := mountDiskFS(t, "2m")
	d := startDaemon(t, daemonOpts{state: filepath.Join(fs.dir, "state"), metricsAddr: "127.0.0.1:0"})
	m := d.mountpoint
	killed := startPy(t, pyFlockHolder, "P="+filepath.Join(m, "killed"))
	killed.expectKey("held", holdTimeout)
	unlocker := startPy(t, pyUnlockingHolder, "P="+filepath.Join(m, "unlocked"))
	unlocker.expectKey("held", holdTimeout)
	settledSnapshot(t, d) // the records reach their files before the disk fills

	fs.fill()
	tl.add("faults", 1)
	killed.killGroup()
	killed.wait(10 * time.Second)
	unlocker.send("unlock")
	unlock := unlocker.expectKey("unlock", holdTimeout)
	time.Sleep(500 * time.Millisecond) // RELEASE of the killed holder is asynchronous (for the log below)
	// What the mount shows decides while the disk is full (a daemon may end a lease in
	// memory before it can persist that); once space is back, the store must agree.
	inMount := func(name string) bool {
		r := sh(t, `ls -A "$M"`, "M="+m)
		return r.code != 0 || slices.Contains(strings.Fields(r.stdout), name)
	}
	inStore := func(name string) bool { return len(liveLeases(t, d.state, name)) > 0 }
	switch {
	case unlock == "ENOSPC" || unlock == "EIO":
		tl.add("refusals", 1)
	case unlock != "ok":
		tl.violation(t, "LOCK_UN on a full disk answered %s, want ok or ENOSPC/EIO", unlock)
	case inMount("unlocked"):
		tl.violation(t, "LOCK_UN on a full disk answered ok, but the mount still lists the handle lease on \"unlocked\"")
	}
	t.Logf("on a full disk: LOCK_UN answered %s; the mount lists killed: %v, unlocked: %v",
		unlock, inMount("killed"), inMount("unlocked"))
	unlocker.killGroup()
	unlocker.wait(10 * time.Second)

	fs.free()
	deadline := time.Now().Add(5 * time.Second)
	for _, name := range []string{"killed", "unlocked"} {
		for (inMount(name) || inStore(name)) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if inMount(name) || inStore(name) {
			tl.violation(t, "the handle lease on %q, whose holder's lock ended while the disk was full, is still live 5 s after space is back: %v\n"+
				"(flock -n: %s)", name, liveLeases(t, d.state, name), sh(t, `flock -n "$P" true`, "P="+filepath.Join(m, name)))
		}
	}
	auditState(t, tl, d.state, "after handle releases on a full disk")
}
