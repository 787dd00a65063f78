package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/internal/testenv"
)

// pyExclRacer waits for a line on stdin, then creates $P with
// O_CREAT|O_EXCL and prints out("result", "ok" or the errno name).
const pyExclRacer = `
out("ready", 1)
sys.stdin.readline()
fd, e = call(os.open, os.environ["P"], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
out("result", e)
`

// pyFIFOWaiter blocks in flock on $P; once granted it prints the grant
// time, appends $I to $ORDER, releases with LOCK_UN (synchronous, §6) and
// prints the release time.
const pyFIFOWaiter = `
import fcntl, time
fd = os.open(os.environ["P"], os.O_CREAT | os.O_RDWR, 0o644)
out("queued", 1)
fcntl.flock(fd, fcntl.LOCK_EX)
out("granted_at", "%.6f" % time.time())
with open(os.environ["ORDER"], "a") as f:
    f.write(os.environ["I"] + "\n")
rel = time.time()
fcntl.flock(fd, fcntl.LOCK_UN)
out("released_at", "%.6f" % rel)
os.close(fd)
`

// pyLockCycler takes blocking flocks on names of $NAMES under $M until the
// file $STOP exists. In each critical section it appends "start NAME PID"
// and, before LOCK_UN, "end NAME PID" to $LOG (O_APPEND), and reads the
// status document through its descriptor at the start and the end: a
// different lease id or an error there means the granted lease was lost.
// It prints out("grants"), out("lost") and out("errors").
const pyLockCycler = `
import fcntl, random, time
names, stop, pid = os.environ["NAMES"].split(), os.environ["STOP"], os.getpid()
log = os.open(os.environ["LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
def lease_id(fd):
    d, e = call(os.pread, fd, 4096, 0)
    if e != "ok":
        return "error:" + e
    for line in d.decode().splitlines():
        if line.startswith("lease_id"):
            return line.split("=", 1)[1].strip()
    return "none"
grants, lost, errors = 0, [], []
while not os.path.exists(stop):
    name = random.choice(names)
    fd, e = call(os.open, os.path.join(M, name), os.O_CREAT | os.O_RDWR, 0o644)
    if e != "ok":
        errors.append("open:" + e)
        time.sleep(0.05)
        continue
    e = err(fcntl.flock, fd, fcntl.LOCK_EX)
    if e != "ok":
        errors.append("flock:" + e)
        os.close(fd)
        time.sleep(0.05)
        continue
    os.write(log, ("start %s %d %.6f\n" % (name, pid, time.time())).encode())
    grants += 1
    first = lease_id(fd)
    time.sleep(random.uniform(0.01, 0.05))
    last = lease_id(fd)
    if first != last or first.startswith("error") or first == "none":
        lost.append("%s:%s->%s" % (name, first, last))
    os.write(log, ("end %s %d %.6f\n" % (name, pid, time.time())).encode())
    e = err(fcntl.flock, fd, fcntl.LOCK_UN)
    if e != "ok":
        errors.append("unlock:" + e)
    os.close(fd)
out("grants", grants)
out("lost", " ".join(lost))
out("errors", " ".join(errors))
`

// holdLogEntry is one line of a mutual-exclusion log: a holder's start or
// end of a critical section on name, at a wall-clock time.
type holdLogEntry struct {
	start bool
	name  string
	pid   string
	at    time.Time
}

// readHoldLog parses the "start|end NAME PID UNIXTIME" lines of path.
func readHoldLog(t testing.TB, path string) []holdLogEntry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("mutual-exclusion log: %v", err)
	}
	defer f.Close()
	var out []holdLogEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 4 || (fs[0] != "start" && fs[0] != "end") {
			t.Fatalf("mutual-exclusion log line %q: want start|end NAME PID TIME", sc.Text())
		}
		sec, err := strconv.ParseFloat(fs[3], 64)
		if err != nil {
			t.Fatalf("mutual-exclusion log line %q: %v", sc.Text(), err)
		}
		out = append(out, holdLogEntry{start: fs[0] == "start", name: fs[1], pid: fs[2],
			at: time.Unix(0, int64(sec*1e9))})
	}
	return out
}

// waitGrants waits until the hold log at path shows n grants (start
// lines) after since: load measured in work done, not in time.
func waitGrants(t testing.TB, path string, since time.Time, n int) {
	t.Helper()
	eventually(t, 60*time.Second, fmt.Sprintf("%d grants after %v", n, since.Format(time.StampMilli)), func() (bool, string) {
		if _, err := os.Stat(path); err != nil {
			return false, err.Error()
		}
		got := 0
		for _, e := range readHoldLog(t, path) {
			if e.start && e.at.After(since) {
				got++
			}
		}
		return got >= n, fmt.Sprintf("%d grants", got)
	})
}

// checkExclusion fails t for every start on a name whose previous holder
// has not logged its end yet (two holders at once), and for every end that
// is not the current holder's. The log is in append order, so a start
// appended after a previous holder's end came after that end.
func checkExclusion(t testing.TB, log []holdLogEntry) {
	t.Helper()
	holders := map[string]map[string]bool{} // name → pids in their critical section
	for i, e := range log {
		set := holders[e.name]
		if set == nil {
			set = map[string]bool{}
			holders[e.name] = set
		}
		switch {
		case e.start && len(set) > 0:
			t.Errorf("log line %d: pid %s holds %s while %v still do: two holders", i+1, e.pid, e.name, slices.Sorted(maps.Keys(set)))
			set[e.pid] = true
		case e.start:
			set[e.pid] = true
		case !set[e.pid]:
			t.Errorf("log line %d: pid %s ends %s, which it does not hold", i+1, e.pid, e.name)
		default:
			delete(set, e.pid)
		}
	}
}

// TestEtcdTwoMountsRaces drives one etcd store through two daemons at once:
// 24 exclusive creates of one name (12 per mount, released together) have
// exactly one winner; 16 blocking flock waiters queued alternately through
// B and A behind a holder on A are granted in arrival order, each release
// waking a waiter of the other mount (the delays are logged).
func TestEtcdTwoMountsRaces(t *testing.T) {
	_, a, b := startTwoEtcdDaemons(t, "/leasefs-races")
	mounts := []*daemon{a, b}

	racers := make([]*bgProc, 24)
	for i := range racers {
		racers[i] = startPy(t, pyExclRacer, "P="+filepath.Join(mounts[i%2].mountpoint, "excl"))
	}
	for _, r := range racers {
		r.expectKey("ready", holdTimeout)
	}
	for _, r := range racers {
		r.send("go")
	}
	results := map[string][]int{}
	for i, r := range racers {
		res := r.expectKey("result", holdTimeout)
		results[res] = append(results[res], i)
	}
	if len(results["ok"]) != 1 || len(results["EEXIST"]) != 23 {
		t.Errorf("24 O_EXCL creates through two mounts: %v (racer i used mount %% 2), want one ok and 23 EEXIST", results)
	}

	pa := filepath.Join(a.mountpoint, "fifo")
	holder := startProc(t, nil, "flock", "-n", pa, "-c", "echo held; exec sleep 60")
	holder.expect(`(?m)^held$`, holdTimeout)
	order := filepath.Join(t.TempDir(), "order")
	waiters := make([]*bgProc, 16)
	for i := range waiters {
		m := mounts[(i+1)%2] // B first: the holder's release through A wakes a waiter on B
		waiters[i] = startPy(t, pyFIFOWaiter, "P="+filepath.Join(m.mountpoint, "fifo"), "ORDER="+order, "I="+strconv.Itoa(i))
		waitWaiters(t, pa, i+1)
	}
	released := time.Now()
	holder.killGroup()
	var want []string
	var hops []time.Duration
	prev := released
	for i, w := range waiters {
		if r := w.wait(30 * time.Second); r.code != 0 {
			t.Fatalf("waiter %d: %s", i, r)
		}
		kv := w.kv()
		granted, rel := unixTime(t, kv["granted_at"]), unixTime(t, kv["released_at"])
		if i > 0 {
			hops = append(hops, granted.Sub(prev))
		} else {
			t.Logf("the holder's exit through A to the grant of waiter 0 on B: %v (includes the kernel's release of the killed holder's file)", granted.Sub(released).Round(time.Millisecond))
		}
		prev = rel
		want = append(want, strconv.Itoa(i))
	}
	got, _ := os.ReadFile(order)
	if string(got) != strings.Join(want, "\n")+"\n" {
		t.Errorf("waiters granted in order %q, want arrival order 0..15", strings.Fields(string(got)))
	}
	if len(hops) > 0 {
		sorted := slices.Clone(hops)
		slices.Sort(sorted)
		t.Logf("LOCK_UN of waiter i to the grant of waiter i+1 on the other mount, %d hops: min %v, median %v, max %v",
			len(hops), sorted[0].Round(time.Millisecond), sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
	}
	for _, d := range mounts {
		if code := d.stop(true); code != 0 {
			t.Errorf("daemon on %s exited %d", d.mountpoint, code)
		}
	}
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// unixTime parses a "%.6f" Unix time printed by a Python client.
func unixTime(t testing.TB, s string) time.Time {
	t.Helper()
	sec, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("time %q: %v", s, err)
	}
	return time.Unix(0, int64(sec*1e9))
}

// TestEtcdClusterLeaderLoss serves a 3-member etcd cluster through two
// daemons given all three endpoints, under load: three clients per mount
// cycle flocks on four names and log their critical sections. The leader
// is stopped in the middle. No two holders of a name overlap, grants go on
// after the election, and no holder loses the lease it was granted.
func TestEtcdClusterLeaderLoss(t *testing.T) {
	testenv.RequireFUSE(t)
	members := etcdtest.StartCluster(t, 3)
	store := []string{"--store", "etcd://" + etcdtest.Endpoints(members) + "/leasefs-cluster"}
	a := startDaemon(t, daemonOpts{leaseDuration: 5 * time.Second, extraArgs: store})
	b := startDaemon(t, daemonOpts{leaseDuration: 5 * time.Second, extraArgs: store})
	dir := t.TempDir()
	log, stop := filepath.Join(dir, "log"), filepath.Join(dir, "stop")
	var clients []*bgProc
	for i := range 6 {
		m := []*daemon{a, b}[i%2]
		clients = append(clients, startPy(t, pyLockCycler, "M="+m.mountpoint, "NAMES=n1 n2 n3 n4", "LOG="+log, "STOP="+stop))
	}
	waitGrants(t, log, time.Time{}, 50) // load before the loss
	leader := -1
	for i, m := range members {
		if m.IsLeader() {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no etcd member leads")
	}
	killed := time.Now()
	members[leader].Stop()
	t.Logf("stopped the leader m%d in %v", leader, time.Since(killed).Round(time.Millisecond))
	var firstAfter time.Duration
	eventually(t, 20*time.Second, "a grant after the leader stopped", func() (bool, string) {
		for _, e := range readHoldLog(t, log) {
			if e.start && e.at.After(killed) {
				firstAfter = e.at.Sub(killed)
				return true, ""
			}
		}
		return false, "no start line after the stop"
	})
	waitGrants(t, log, killed, 50) // load after the election
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	total := 0
	deadline := time.Now().Add(15 * time.Second)
	for i, c := range clients {
		for c.running() && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if c.running() {
			t.Fatalf("client %d (mount %s) still runs 15s after the stop file: %s\ndaemon A:\n%s\ndaemon B:\n%s",
				i, []*daemon{a, b}[i%2].mountpoint, c, tail(a.stderr(), 3000), tail(b.stderr(), 3000))
		}
		r := c.wait(time.Second)
		kv := c.kv()
		if r.code != 0 {
			t.Fatalf("client %d: %s", i, r)
		}
		n, _ := strconv.Atoi(kv["grants"])
		total += n
		if kv["lost"] != "" {
			t.Errorf("client %d lost granted leases: %s", i, kv["lost"])
		}
		if kv["errors"] != "" {
			t.Logf("client %d saw failed calls (the election): %.300s", i, kv["errors"])
		}
	}
	entries := readHoldLog(t, log)
	checkExclusion(t, entries)
	after := 0
	for _, e := range entries {
		if e.start && e.at.After(killed) {
			after++
		}
	}
	t.Logf("%d grants in all, %d after the leader stopped; the first %v after the stop", total, after, firstAfter.Round(time.Millisecond))
	for _, d := range []*daemon{a, b} {
		if code := d.stop(true); code != 0 {
			t.Errorf("daemon on %s exited %d", d.mountpoint, code)
		}
	}
}

// pyStaleHolder takes the flock of $P, logs its start to $LOG, prints
// out("held") and then reads the status document through its descriptor
// every 20 ms until a read fails with ESTALE: it then logs its end and
// prints out("stale_at") and out("longest_read"), in seconds. Other errors
// (EIO while the cluster is away) are counted and it keeps reading.
const pyStaleHolder = `
import fcntl, time
name, pid = os.path.basename(os.environ["P"]), os.getpid()
log = os.open(os.environ["LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
fd = os.open(os.environ["P"], os.O_CREAT | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.write(log, ("start %s %d %.6f\n" % (name, pid, time.time())).encode())
out("held", 1)
other, longest = {}, 0.0
while True:
    t0 = time.time()
    e = err(os.pread, fd, 4096, 0)
    longest = max(longest, time.time() - t0)
    if e == "ESTALE":
        break
    if e != "ok":
        other[e] = other.get(e, 0) + 1
    time.sleep(0.02)
now = time.time()
os.write(log, ("end %s %d %.6f\n" % (name, pid, now)).encode())
out("stale_at", "%.6f" % now)
out("other_errors", json.dumps(other))
out("longest_read", "%.3f" % longest)
`

// pyTaker blocks in flock on $P, logs start and end of a short critical
// section to $LOG and prints out("granted_at").
const pyTaker = `
import fcntl, time
name, pid = os.path.basename(os.environ["P"]), os.getpid()
log = os.open(os.environ["LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
fd = os.open(os.environ["P"], os.O_CREAT | os.O_RDWR, 0o644)
out("queued", 1)
fcntl.flock(fd, fcntl.LOCK_EX)
now = time.time()
os.write(log, ("start %s %d %.6f\n" % (name, pid, now)).encode())
out("granted_at", "%.6f" % now)
time.sleep(0.1)
os.write(log, ("end %s %d %.6f\n" % (name, pid, time.time())).encode())
fcntl.flock(fd, fcntl.LOCK_UN)
`

// TestEtcdCutOffHolder cuts daemon A off the cluster while it holds three
// handle leases wanted by blocked waiters on B. A's leases are in jeopardy
// for the grace period (their holders' reads wait), then end within the
// lease duration + the grace period + a bounded margin; their descriptors
// answer ESTALE, B's waiters get the names only after that, and the log
// shows no two holders of a name at any moment (docs/PROTOCOL.md §8a).
func TestEtcdCutOffHolder(t *testing.T) {
	testenv.RequireFUSE(t)
	const ttl, grace = 2 * time.Second, 2 * time.Second
	const margin = 4 * time.Second
	srv := etcdtest.Start(t)
	proxy := etcdtest.NewProxy(t, srv.Endpoint())
	prefix := "/leasefs-cut"
	a := startDaemon(t, daemonOpts{leaseDuration: ttl, extraArgs: []string{"--store", "etcd://" + proxy.Endpoint() + prefix, "--etcd-grace", grace.String()}})
	b := startDaemon(t, daemonOpts{leaseDuration: ttl, extraArgs: []string{"--store", "etcd://" + srv.Endpoint() + prefix}})
	log := filepath.Join(t.TempDir(), "log")
	names := []string{"c1", "c2", "c3"}
	var holders, takers []*bgProc
	for _, n := range names {
		h := startPy(t, pyStaleHolder, "P="+filepath.Join(a.mountpoint, n), "LOG="+log)
		h.expectKey("held", holdTimeout)
		holders = append(holders, h)
		k := startPy(t, pyTaker, "P="+filepath.Join(b.mountpoint, n), "LOG="+log)
		waitWaiters(t, filepath.Join(b.mountpoint, n), 1)
		takers = append(takers, k)
	}
	cut := time.Now()
	proxy.Cut()
	for i, n := range names {
		stale := unixTime(t, holders[i].expectKey("stale_at", ttl+grace+margin+5*time.Second)).Sub(cut)
		granted := unixTime(t, takers[i].expectKey("granted_at", ttl+grace+margin+5*time.Second)).Sub(cut)
		kv := holders[i].kv()
		t.Logf("%s: the holder on A read ESTALE %v after the cut (longest read %s s, other errors %s), the waiter on B was granted %v after the cut",
			n, stale.Round(time.Millisecond), kv["longest_read"], kv["other_errors"], granted.Round(time.Millisecond))
		if stale >= granted {
			t.Errorf("%s: the cut-off holder read ESTALE %v after the cut, not before the waiter on B was granted (%v)", n, stale, granted)
		}
		if stale > ttl+grace+margin || stale < grace {
			t.Errorf("%s: the cut-off holder's lease ended %v after the cut, want after the grace period (%v) and at most %v + %v + %v", n, stale, grace, ttl, grace, margin)
		}
		if longest, _ := strconv.ParseFloat(kv["longest_read"], 64); longest < grace.Seconds()/2 {
			t.Errorf("%s: the holder's longest read took %s s; want it to wait through the jeopardy (about %v)", n, kv["longest_read"], grace)
		}
	}
	for _, k := range takers {
		if r := k.wait(10 * time.Second); r.code != 0 {
			t.Errorf("waiter on B: %s", r)
		}
	}
	checkExclusion(t, readHoldLog(t, log))

	// leasefs status names the daemon's etcd store and tells whether the
	// cluster answers it (through the same cut proxy).
	r := runClient(t, nil, leasefsBin, "status", "--state", a.state, "--json")
	var st map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || r.code != 5 {
		t.Fatalf("leasefs status of the cut-off daemon: %v: %s", err, r)
	}
	if st["store"] != "etcd" || st["store_url"] != "etcd://"+proxy.Endpoint()+prefix || st["cluster"] != "unreachable" || st["cluster_error"] == "" {
		t.Errorf("leasefs status --json of the cut-off daemon = %v, want store etcd, its store_url, cluster unreachable with an error", st)
	}
	r = runClient(t, nil, leasefsBin, "status", "--state", b.state)
	if r.code != 0 || !strings.Contains(r.stdout, "store:       etcd://"+srv.Endpoint()+prefix) || !strings.Contains(r.stdout, "cluster:     reachable") ||
		!strings.Contains(r.stdout, "leases:      0 token, 0 handle") {
		t.Errorf("leasefs status of the connected daemon: %s\nwant its etcd store, cluster reachable, no leases", r)
	}
	b.stop(true)
	a.stop(false)
}

// Through etcd's gRPC proxy (docs/OPERATIONS.md, "Laying out a fleet"): two mounts that
// reach the cluster only through one `etcd grpc-proxy` exclude each other
// (a create and a flock), and a blocking flock on one is granted when the
// holder on the other exits: reservations, keep-alives and the watch all
// pass through the proxy.
func TestEtcdThroughGRPCProxy(t *testing.T) {
	testenv.RequireFUSE(t)
	bin := requireTool(t, "etcd")
	srv := etcdtest.Start(t)
	ports, err := freeLoopbackPorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	proxy := startProc(t, nil, bin, "grpc-proxy", "start", "--endpoints="+srv.Endpoint(), "--listen-addr="+addr)
	eventually(t, 20*time.Second, "the gRPC proxy listens", func() (bool, string) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false, fmt.Sprintf("%v; proxy: %s", err, proxy)
		}
		c.Close()
		return true, ""
	})
	store := []string{"--store", "etcd://" + addr + "/via-proxy"}
	a := startDaemon(t, daemonOpts{leaseDuration: 5 * time.Second, extraArgs: store})
	b := startDaemon(t, daemonOpts{leaseDuration: 5 * time.Second, extraArgs: store})
	mustSh(t, `set -C; : > "$A/job"`, "A="+a.mountpoint)
	if r := sh(t, `set -C; : > "$B/job"`, "B="+b.mountpoint); r.code == 0 || !strings.Contains(r.stderr, "cannot overwrite") {
		t.Errorf("create of a name held through the other mount: %s, want it refused (EEXIST)", r)
	}
	holder := startProc(t, nil, "flock", "-n", filepath.Join(a.mountpoint, "h"), "sh", "-c", "echo held; exec sleep 60")
	holder.expect("held", 10*time.Second)
	if r := sh(t, `flock -n "$B/h" true`, "B="+b.mountpoint); r.code != 1 {
		t.Errorf("flock -n through the other mount while held: %s, want exit 1", r)
	}
	waiter := startProc(t, nil, "flock", filepath.Join(b.mountpoint, "h"), "echo", "granted")
	waitWaiters(t, filepath.Join(a.mountpoint, "h"), 1) // queued behind the holder, seen through the holder's mount
	if !waiter.running() {
		t.Fatalf("the blocking flock returned while the name was held: %s", waiter)
	}
	holder.killGroup()
	waiter.expect("granted", 15*time.Second)
}
