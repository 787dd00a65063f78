package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/internal/testenv"
)

// Handle leases ride out an etcd leader election (docs/PROTOCOL.md §8a,
// "Elections and jeopardy"): past its local deadline without a confirmed
// keep-alive a handle lease is in jeopardy for a grace period, its
// holder's calls wait, and it ends only when the grace period passes or
// the cluster says its etcd lease is gone.

// pyQuietHolder takes the flock of $P, prints out("held") with the lease
// id it read once, and then never asks again until the file $STOP exists;
// it then reads the status document once more and prints
// out("lease_at_stop") (the lease id, or the errno).
const pyQuietHolder = `
import fcntl, time
fd = os.open(os.environ["P"], os.O_CREAT | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
def lease_id():
    d, e = call(os.pread, fd, 4096, 0)
    if e != "ok":
        return e
    for line in d.decode().splitlines():
        if line.startswith("lease_id"):
            return line.split("=", 1)[1].strip()
    return "none"
out("held", lease_id())
while not os.path.exists(os.environ["STOP"]):
    time.sleep(0.1)
out("lease_at_stop", lease_id())
`

// pyTryTaker tries, every 50 ms, a non-blocking flock of each of $NAMES
// under $M, all held through the other mount; it prints out("overlaps")
// with each name it got (an overlap) and out("tries") when $STOP exists.
const pyTryTaker = `
import fcntl, time
names, tries, overlaps = os.environ["NAMES"].split(), 0, []
while not os.path.exists(os.environ["STOP"]):
    for n in names:
        fd, e = call(os.open, os.path.join(M, n), os.O_RDONLY)
        if e != "ok":
            continue
        tries += 1
        if err(fcntl.flock, fd, fcntl.LOCK_EX | fcntl.LOCK_NB) == "ok":
            overlaps.append(n)
        os.close(fd)
    time.sleep(0.05)
out("tries", tries)
out("overlaps", " ".join(overlaps))
`

// TestEtcdLeaderKilledKeepsHandleLeases kills the leader of a 3-member
// cluster five times (no leadership transfer: an election after the
// election timeout) under load, while eight handle leases are held through
// two mounts by processes that never ask (flock(1) and a quiet Python
// holder) and contenders on the other mount try to take them. With a 3 s
// lease duration and a grace period that covers an election, no handle
// lease ends and no name is ever held twice.
func TestEtcdLeaderKilledKeepsHandleLeases(t *testing.T) {
	testenv.RequireFUSE(t)
	// An election timeout of 2 s (etcd's default is 1 s): a follower
	// starts the election 2 s to 4 s after the kill, so that an election
	// can outlast the local deadline of a 3 s lease duration (2 s after
	// the last confirmed keep-alive) and put the handle leases in
	// jeopardy; a 5 s grace period covers the longest election and the
	// clients' failover.
	members := etcdtest.StartClusterElection(t, 3, 2*time.Second)
	// The daemons reach each member through a proxy that is cut at the
	// member's kill: an embedded member that is hard-stopped still answers
	// keep-alives from its lessor until its listeners close (which took
	// up to 10 s on a loaded machine), so without the cut a crash would
	// not look like one to its clients and the election would not put
	// the handle leases in jeopardy.
	proxies := make([]*etcdtest.Proxy, len(members))
	eps := make([]string, len(members))
	for i, m := range members {
		proxies[i] = etcdtest.NewProxy(t, m.Endpoint())
		eps[i] = proxies[i].Endpoint()
	}
	grace := "5s"
	if g := os.Getenv("LEASEFS_TEST_ETCD_GRACE"); g != "" {
		// To show what the test catches: LEASEFS_TEST_ETCD_GRACE=0 ends
		// handle leases in the elections.
		grace = g
	}
	store := []string{"--store", "etcd://" + strings.Join(eps, ",") + "/leasefs-jeopardy", "--etcd-grace", grace}
	a := startDaemon(t, daemonOpts{leaseDuration: 3 * time.Second, extraArgs: store, metricsAddr: "127.0.0.1:0"})
	b := startDaemon(t, daemonOpts{leaseDuration: 3 * time.Second, extraArgs: store, metricsAddr: "127.0.0.1:0"})
	flockBin := requireTool(t, "flock")
	dir := t.TempDir()
	log, stop, stopTries := filepath.Join(dir, "log"), filepath.Join(dir, "stop"), filepath.Join(dir, "stop-tries")
	mounts := []*daemon{a, b}
	var quiet []*bgProc
	var flocks []*bgProc
	held := map[string]string{} // name → lease id at the start
	namesOn := [2][]string{}
	for i := range 8 {
		m, name := mounts[i%2], fmt.Sprintf("h%d", i)
		namesOn[i%2] = append(namesOn[i%2], name)
		p := filepath.Join(m.mountpoint, name)
		if i < 4 {
			// flock(1) holds the lock while its command runs; it never asks.
			f := startProc(t, nil, flockBin, "-n", "-E", "99", p, "sleep", "600")
			flocks = append(flocks, f)
			eventually(t, holdTimeout, "flock(1) holds "+name, func() (bool, string) {
				r := runClient(t, nil, "getfattr", "--only-values", "-n", "user.lease.mode", p)
				return r.code == 0 && r.stdout == "handle", r.String()
			})
			r := runClient(t, nil, "getfattr", "--only-values", "-n", "user.lease.lease_id", p)
			held[name] = r.stdout
			continue
		}
		q := startPy(t, pyQuietHolder, "P="+p, "STOP="+stop)
		held[name] = q.expectKey("held", holdTimeout)
		quiet = append(quiet, q)
	}
	var contenders, cyclers []*bgProc
	for i := range 2 {
		// Contenders on the other mount of each holder.
		contenders = append(contenders, startPy(t, pyTryTaker, "M="+mounts[i].mountpoint, "NAMES="+strings.Join(namesOn[1-i], " "), "STOP="+stopTries))
	}
	for i := range 4 {
		m := mounts[i%2]
		cyclers = append(cyclers, startPy(t, pyLockCycler, "M="+m.mountpoint, "NAMES=n1 n2 n3", "LOG="+log, "STOP="+stop))
	}
	waitGrants(t, log, time.Time{}, 20) // load before the first election
	for round := range 5 {
		leader := -1
		for deadline := time.Now().Add(10 * time.Second); leader < 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			for i, m := range members {
				if m.IsLeader() {
					leader = i
				}
			}
		}
		if leader < 0 {
			t.Fatalf("round %d: no etcd member leads", round)
		}
		killed := time.Now()
		proxies[leader].Cut()
		members[leader].Kill()
		t.Logf("round %d: killed the leader m%d", round, leader)
		// The election, and load under the new leader.
		waitGrants(t, log, killed, 20)
		members[leader].Restart(t)
		proxies[leader].Resume(t)
		t.Logf("round %d: m%d back %v after its kill", round, leader, time.Since(killed).Round(time.Millisecond))
		// The restarted member catches up before the next kill, which
		// would otherwise leave the cluster without a quorum.
		var target uint64
		for i, m := range members {
			if i != leader {
				target = max(target, m.CommittedIndex())
			}
		}
		eventually(t, 30*time.Second, fmt.Sprintf("m%d caught up to index %d", leader, target), func() (bool, string) {
			got := members[leader].CommittedIndex()
			return got >= target, fmt.Sprintf("at %d", got)
		})
	}
	// The contenders stop first: the holders let go once they stop.
	if err := os.WriteFile(stopTries, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, c := range contenders {
		if r := c.wait(20 * time.Second); r.code != 0 {
			t.Fatalf("contender %d: %s", i, r)
		}
		kv := c.kv()
		t.Logf("contender on %s: %s tries", mounts[i].mountpoint, kv["tries"])
		if kv["overlaps"] != "" {
			t.Errorf("contender on %s took names held through the other mount: %s", mounts[i].mountpoint, kv["overlaps"])
		}
	}
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, q := range quiet {
		name := fmt.Sprintf("h%d", 4+i)
		if got := q.expectKey("lease_at_stop", 20*time.Second); got != held[name] {
			t.Errorf("%s: the quiet holder's lease at the end is %q, want the one it took (%s)", name, got, held[name])
		}
	}
	for i, f := range flocks {
		name := fmt.Sprintf("h%d", i)
		if !f.running() {
			t.Errorf("%s: flock(1) exited: %s", name, f)
		}
		r := runClient(t, nil, "getfattr", "--only-values", "-n", "user.lease.lease_id", filepath.Join(mounts[i%2].mountpoint, name))
		if r.code != 0 || r.stdout != held[name] {
			t.Errorf("%s: the lease flock(1) holds is now %s, want the one it took (%s)", name, r, held[name])
		}
	}
	grants := 0
	for i, c := range cyclers {
		for end := time.Now().Add(30 * time.Second); c.running() && time.Now().Before(end); {
			time.Sleep(50 * time.Millisecond)
		}
		if c.running() {
			sc, _ := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", c.pid))
			_ = os.WriteFile("/tmp/jeop.a", []byte(a.stderr()), 0o644)
			_ = os.WriteFile("/tmp/jeop.b", []byte(b.stderr()), 0o644)
			t.Fatalf("cycler %d (pid %d, on %s) still runs 30 s after the stop file, in system call %s", i, c.pid, mounts[i%2].mountpoint, sc)
		}
		r := c.wait(30 * time.Second)
		if r.code != 0 {
			t.Fatalf("cycler %d: %s", i, r)
		}
		kv := c.kv()
		if kv["lost"] != "" {
			t.Errorf("cycler %d lost granted leases: %s", i, kv["lost"])
		}
		var n int
		fmt.Sscan(kv["grants"], &n)
		grants += n
	}
	checkExclusion(t, readHoldLog(t, log))
	entered := 0.0
	for _, d := range mounts {
		m, _ := scrapeMetrics(t, d.metricsURL(t))
		entered += m["leasefs_handle_lease_jeopardy_total"]
		total, saved := m["leasefs_handle_lease_jeopardy_total"], m["leasefs_handle_lease_jeopardy_saved_total"]
		ended := strings.Count(d.stderr(), "keep-alive of the handle lease not confirmed")
		t.Logf("daemon on %s: %v handle leases entered jeopardy, %v kept; %d ended for want of a keep-alive", d.mountpoint, total, saved, ended)
		// A lease its holder released while in jeopardy is neither kept
		// nor ended: saved may be below total.
		if ended != 0 || saved > total || m["leasefs_handle_leases_in_jeopardy"] != 0 {
			t.Errorf("daemon on %s ended %d handle leases (jeopardy: %v entered, %v kept, %v now):\n%s",
				d.mountpoint, ended, total, saved, m["leasefs_handle_leases_in_jeopardy"], tail(d.stderr(), 3000))
		}
	}
	t.Logf("%d lease cycles of the load across 5 elections", grants)
	if entered == 0 {
		t.Error("no handle lease entered jeopardy in five elections: the test did not exercise the grace period")
	}
	for _, f := range flocks {
		f.killGroup()
	}
	for _, d := range mounts {
		d.stop(false)
	}
}

// pyJeopardyHolder takes the flock of $P and prints out("held"); then, for
// each line "CMD KEY" it reads on stdin: "read" reads the status document
// through its descriptor and prints out(KEY) with "ok" or the errno;
// "read_alarm" does the same through libc with a SIGALRM 300 ms later (a
// handler that does not restart the call).
const pyJeopardyHolder = `
import ctypes, fcntl, signal
libc = ctypes.CDLL(None, use_errno=True)
libc.pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
signal.signal(signal.SIGALRM, lambda *a: None)
fd = os.open(os.environ["P"], os.O_CREAT | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
out("held", 1)
buf = ctypes.create_string_buffer(4096)
for line in sys.stdin:
    cmd, key = line.split()
    if cmd == "read":
        out(key, err(os.pread, fd, 4096, 0))
    elif cmd == "read_alarm":
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        n = libc.pread(fd, buf, 4096, 0)
        e = ctypes.get_errno()
        out(key, "ok" if n >= 0 else errno.errorcode.get(e, str(e)))
`

// awaitJeopardy waits until daemon d logs that its handle leases are in
// jeopardy for the n-th time.
func awaitJeopardy(t *testing.T, d *daemon, n int) {
	t.Helper()
	eventually(t, 20*time.Second, "the daemon logs its handle leases in jeopardy", func() (bool, string) {
		return strings.Count(d.stderr(), "handle leases in jeopardy") >= n, tail(d.stderr(), 2000)
	})
}

// TestEtcdJeopardyCallsWait cuts daemon A off the cluster while a holder
// holds a handle lease through it (lease duration 2 s, grace 90 s: on a
// loaded CI machine the client's reconnection after a cut has taken more
// than 30 s, and nothing here waits for the grace to pass). In
// jeopardy the holder's read waits, and answers as if nothing happened
// once the cluster is back; a read interrupted by a signal answers EINTR;
// everyone else is answered at once (another process's flock -n through
// the other mount is refused: the lease still exists); leasefs lock does
// not count jeopardy as a lost lease; leasefs status and the metrics count
// the leases in jeopardy, then saved.
func TestEtcdJeopardyCallsWait(t *testing.T) {
	testenv.RequireFUSE(t)
	srv := etcdtest.Start(t)
	proxy := etcdtest.NewProxy(t, srv.Endpoint())
	prefix := "/leasefs-jeopardy-calls"
	// At debug level, so that the check below that no lease ended sees the
	// ends logged per lease too (docs/PROTOCOL.md §8b, "Logs").
	a := startDaemon(t, daemonOpts{leaseDuration: 2 * time.Second, metricsAddr: "127.0.0.1:0",
		extraArgs: []string{"--store", "etcd://" + proxy.Endpoint() + prefix, "--etcd-grace", "90s", "--log-level", "debug"}})
	b := startDaemon(t, daemonOpts{leaseDuration: 2 * time.Second, extraArgs: []string{"--store", "etcd://" + srv.Endpoint() + prefix}})
	h := startPy(t, pyJeopardyHolder, "P="+filepath.Join(a.mountpoint, "j"))
	h.expectKey("held", holdTimeout)
	// leasefs lock, whose checks read through its descriptor, rides out
	// both cuts: its command is not stopped and it exits with its status.
	done := filepath.Join(t.TempDir(), "done")
	lock := startProc(t, nil, leasefsBin, "lock", "--mount", a.mountpoint, "jl", "--",
		"sh", "-c", `while [ ! -e "$1" ]; do sleep 0.1; done`, "sh", done)
	eventually(t, holdTimeout, "leasefs lock holds jl", func() (bool, string) {
		r := runClient(t, nil, "getfattr", "--only-values", "-n", "user.lease.mode", filepath.Join(a.mountpoint, "jl"))
		return r.code == 0 && r.stdout == "handle", r.String()
	})

	proxy.Cut()
	awaitJeopardy(t, a, 1)
	// Anyone else is answered at once; the lease still exists.
	r := runClient(t, nil, "flock", "-n", "-E", "99", filepath.Join(b.mountpoint, "j"), "true")
	if r.code != 99 {
		t.Errorf("flock -n through the other mount during jeopardy: %s; want refused (exit 99)", r)
	}
	r = runClient(t, nil, "getfattr", "--only-values", "-n", "user.lease.mode", filepath.Join(a.mountpoint, "j"))
	if r.code != 0 || r.stdout != "handle" {
		t.Errorf("getfattr by another process through the cut-off mount during jeopardy: %s; want handle", r)
	}
	r = runClient(t, nil, leasefsBin, "status", "--state", a.state, "--json")
	var st map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("leasefs status --json: %v: %s", err, r)
	}
	if st["handle_leases_in_jeopardy"] != 2.0 {
		t.Errorf("leasefs status --json during jeopardy = %v, want handle_leases_in_jeopardy 2", st)
	}
	// The holder's read waits until the cluster answers.
	h.send("read in_jeopardy")
	time.Sleep(time.Second)
	if got := h.kv()["in_jeopardy"]; got != "" {
		t.Fatalf("the holder's read during jeopardy answered %q at once; want it to wait for the cluster", got)
	}
	resumed := time.Now()
	proxy.Resume(t)
	got := h.expectKey("in_jeopardy", 80*time.Second)
	t.Logf("the holder's read answered %s %v after the cluster came back", got, time.Since(resumed).Round(time.Millisecond))
	if got != "ok" {
		t.Errorf("the holder's read once the cluster is back answered %s, want ok", got)
	}

	// Interrupted while waiting: EINTR, and the lease is still held.
	proxy.Cut()
	awaitJeopardy(t, a, 2)
	h.send("read_alarm interrupted")
	if got := h.expectKey("interrupted", 20*time.Second); got != "EINTR" {
		t.Errorf("the holder's read interrupted during jeopardy answered %s, want EINTR", got)
	}
	proxy.Resume(t)
	eventually(t, 80*time.Second, "the daemon keeps the lease alive again", func() (bool, string) {
		return strings.Count(a.stderr(), "handle leases kept alive through jeopardy") >= 2, tail(a.stderr(), 2000)
	})
	m, _ := scrapeMetrics(t, a.metricsURL(t))
	if m["leasefs_handle_lease_jeopardy_total"] != 4 || m["leasefs_handle_lease_jeopardy_saved_total"] != 4 || m["leasefs_handle_leases_in_jeopardy"] != 0 {
		t.Errorf("jeopardy metrics = total %v, saved %v, now %v; want 4, 4, 0 (two leases, two cuts)", m["leasefs_handle_lease_jeopardy_total"],
			m["leasefs_handle_lease_jeopardy_saved_total"], m["leasefs_handle_leases_in_jeopardy"])
	}
	r = runClient(t, nil, leasefsBin, "status", "--state", a.state)
	if !strings.Contains(r.stdout, "jeopardy:    0 handle leases") {
		t.Errorf("leasefs status after jeopardy: %s; want a jeopardy line of 0", r)
	}
	if strings.Contains(a.stderr(), "lease ended") {
		t.Errorf("the cut-off daemon ended a lease:\n%s", tail(a.stderr(), 3000))
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := lock.wait(30 * time.Second); r.code != 0 || strings.Contains(r.stderr, "lost") {
		t.Errorf("leasefs lock across two jeopardies: %s; want exit 0 with its command's status", r)
	}
	h.send("read after")
	if got := h.expectKey("after", 10*time.Second); got != "ok" {
		t.Errorf("the holder's read after both cuts answered %s, want ok", got)
	}
	b.stop(true)
	a.stop(false)
}
