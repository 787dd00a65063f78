package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/testenv"
)

// The reliability suite. Run it with
//
//	LEASEFS_REQUIRE_FUSE=1 LEASEFS_REPORT=$PWD/RELIABILITY.md go test -count=1 -timeout 20m -run Reliability -v ./integration/
//
// (-short runs 15 s of chaos and 10 crashes instead of 60 s and 50.) Both
// tests drive one daemon with a fleet of real client processes (see
// reliability_clients_test.go) and check the operation history they log
// (reliability_model_test.go, reliability_porcupine_test.go); the crash test
// also kills the daemon again and again and inspects the state directory
// after every restart (reliability_state_test.go).

const (
	// relLease is the --lease-duration of the reliability runs: short, so
	// that stalls outlast it.
	relLease = 2 * time.Second
	// relNamespace is the namespace the clients lease in: while a killed
	// daemon's mountpoint is detached and not yet mounted again, the bare
	// directory has no such subdirectory, so a client's O_CREAT fails with
	// ENOENT instead of creating a plain file under the mountpoint.
	relNamespace = "mx"
)

// relNames are the lease names the clients contend for.
var relNames = []string{"n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"}

// setupReliability checks the tools, mounts a daemon and prepares the fleet
// configuration; the fleet is not started.
func setupReliability(t *testing.T, logDir string) (*daemon, fleetConfig) {
	t.Helper()
	testenv.RequireFUSE(t)
	requireTool(t, "flock")
	requireTool(t, "bash")
	python := otherPython(t)
	goclient := buildGoClient(t)
	d := startDaemon(t, daemonOpts{leaseDuration: relLease})
	if err := os.Mkdir(filepath.Join(d.mountpoint, relNamespace), 0o755); err != nil {
		t.Fatalf("mkdir namespace: %v", err)
	}
	return d, fleetConfig{
		dir:      filepath.Join(d.mountpoint, relNamespace),
		names:    relNames,
		lease:    relLease,
		logDir:   logDir,
		goclient: goclient,
		python:   python,
		slots:    reliabilityMix,
	}
}

// keepLogDir returns a directory for logs that outlives the test when it fails,
// so that the client logs and the porcupine visualization can be inspected.
func keepLogDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "leasefs-"+strings.ToLower(t.Name())+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			os.RemoveAll(dir)
		} else {
			t.Logf("client logs kept in %s", dir)
		}
	})
	return dir
}

// daemonProblems reports panics, errors and corrupt-record warnings in a
// daemon's log.
func daemonProblems(stderr string) []string {
	var out []string
	for _, line := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(line, "panic:") || strings.Contains(line, "fatal error:") || strings.Contains(line, "level=ERROR") ||
			strings.Contains(line, "skipping corrupt lease record") || strings.Contains(line, "skipping unreadable lease record") {
			out = append(out, line)
		}
	}
	return out
}

// TestReliabilityMutualExclusion runs 24 clients (bash, python3, flock(1), Go)
// over 8 names for 60 s, mixing token and handle leases, while a chaos loop
// SIGKILLs random clients and SIGSTOPs others past the lease duration, then
// checks the logged history with porcupine and the direct invariants.
func TestReliabilityMutualExclusion(t *testing.T) {
	logDir := keepLogDir(t)
	d, cfg := setupReliability(t, logDir)
	f := startFleet(t, cfg)

	chaosFor, pKill, pStall := 60*time.Second, 0.35, 0.35
	if testing.Short() {
		// A quarter of the time: stalls take the larger share, so that
		// some stalled holder still renews late (checked below).
		chaosFor, pKill, pStall = 15*time.Second, 0.2, 0.6
	}
	ctx, cancel := context.WithTimeout(context.Background(), chaosFor)
	defer cancel()
	f.chaos(ctx, pKill, pStall, 4)
	f.stop()
	d.stop(true)
	for _, e := range f.errs {
		t.Error(e)
	}

	h := f.history(relLease, nil)
	if err := h.load(); err != nil {
		t.Fatalf("reading client logs: %v", err)
	}
	r := h.check(logDir)
	for _, p := range daemonProblems(d.stderr()) {
		r.add("daemon log", "%s", p)
	}
	tokens := h.tokens()
	if hits := findTokens(d.stderr(), tokens); len(hits) > 0 {
		r.add("token in daemon log", "%d tokens, e.g. %s…", len(hits), hits[0][:8])
	}
	r.refusedEnded = checkRefusedStayEnded(t, d.state, h, r)
	reportMutualExclusion(t, "mutual exclusion", f, h, r)
	if r.lateRenews == 0 {
		t.Errorf("no stalled holder renewed late: the stalls did not exercise expiry")
	}
}

// checkRefusedStayEnded checks in `leasefs history` that every lease whose
// renew was refused with ESTALE ended as abandoned and that the refused renew
// did not move its heartbeat: a refusal never resurrects a lease. It returns
// how many leases it checked.
func checkRefusedStayEnded(t *testing.T, state string, h *opHistory, r *checkReport) int {
	t.Helper()
	ended := cliJSON(t, "history", "--state", state, "--json")
	checked := map[string]bool{}
	for _, o := range h.ops {
		if o.op != "renew" || o.result != "ESTALE" || checked[o.lease] {
			continue
		}
		checked[o.lease] = true
		e := findLease(ended, o.lease)
		if e == nil || e["status"] != "abandoned" {
			r.add("refused lease not ended", "%s: history has %v", o, e)
			continue
		}
		if hb := recordTimeOf(fmt.Sprint(e["heartbeat_at"])); !hb.Before(time.Unix(0, o.wall)) {
			r.add("refused renew moved the heartbeat", "%s called at %s; heartbeat_at = %v",
				o, time.Unix(0, o.wall).UTC().Format(time.RFC3339Nano), e["heartbeat_at"])
		}
	}
	return len(checked)
}

// reportMutualExclusion logs and records the figures of a checked run and
// fails the test on violations.
func reportMutualExclusion(t *testing.T, area string, f *fleet, h *opHistory, r *checkReport) {
	t.Helper()
	t.Logf("%s: %d clients, %d operations checked, %d acquisitions, %d killed, %d stalled, %d late renews (%d refused with ESTALE), porcupine %s, closest handoff %v",
		area, len(h.clients), r.operations, r.acquisitions, f.kills, f.stalls, r.lateRenews, r.lateRefused, r.linearizable, time.Duration(r.closest))
	var keys []string
	for k := range r.results {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		t.Logf("  %-40s %d", k, r.results[k])
	}
	recordFigure(area, "client processes (bash, python3, flock(1), Go)", len(h.clients))
	recordFigure(area, "operations checked", r.operations)
	recordFigure(area, "leases acquired", r.acquisitions)
	recordFigure(area, "clients killed", f.kills)
	recordFigure(area, "clients stalled past the lease duration", f.stalls)
	if r.lateRenews > 0 || !h.crashRun {
		recordFigure(area, "late renews of stalled holders refused (ESTALE)", fmt.Sprintf("%d of %d", r.lateRefused, r.lateRenews))
	}
	recordFigure(area, "porcupine (lease model, per name)", r.linearizable)
	if r.closest >= 0 {
		recordFigure(area, "closest handoff between successive holders of a name", time.Duration(r.closest).Round(10*time.Microsecond))
	}
	if r.refusedEnded > 0 {
		recordFigure(area, "refused leases found ended in history, heartbeat unmoved by the late renew", r.refusedEnded)
	}
	recordFigure(area, "violations", len(r.violations))
	if len(r.violations) > 0 {
		t.Errorf("%s: %d violations:\n%s", area, len(r.violations), r.describe(40))
		if out := f.clientOutput(); out != "" {
			t.Logf("client output:\n%s", out)
		}
	}
}

// tokens returns every token the clients read.
func (h *opHistory) tokens() map[string]bool {
	out := map[string]bool{}
	for _, o := range h.ops {
		if o.token != "" {
			out[o.token] = true
		}
	}
	return out
}

// tokenBodyRE matches the random part of a token (and other base32 ids).
var tokenBodyRE = regexp.MustCompile(`[a-z2-7]{39}`)

// findTokens returns the tokens of the set (and any "hwl_" token-like string)
// that appear in text.
func findTokens(text string, tokens map[string]bool) []string {
	var hits []string
	for _, m := range tokenBodyRE.FindAllString(text, -1) {
		if tokens["hwl_"+m] {
			hits = append(hits, "hwl_"+m)
		}
	}
	if strings.Contains(text, "hwl_") && len(hits) == 0 {
		hits = append(hits, "hwl_(unknown token)")
	}
	return hits
}

// TestReliabilityDaemonCrash runs the same load and SIGKILLs the daemon at
// random moments at least 50 times, starting a new daemon on the same state
// and mountpoint each time. After every crash and restart it checks that the
// store loads, that every change a syscall acknowledged before the crash is in
// the records, that no record is half-written and no temporary file survives
// the restart, that a torn journal tail planted after some crashes is
// dropped, that no token is stored, and that token leases keep their
// heartbeat across the restart; at the end it checks mutual exclusion over the
// whole run.
func TestReliabilityDaemonCrash(t *testing.T) {
	crashes := 50
	if testing.Short() {
		crashes = 10
	}
	logDir := keepLogDir(t)
	d, cfg := setupReliability(t, logDir)
	state, mp := d.state, d.mountpoint
	f := startFleet(t, cfg)

	ctx, cancel := context.WithCancel(context.Background())
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		f.chaos(ctx, 0.2, 0.2, 3)
	}()
	t.Cleanup(func() { cancel(); <-chaosDone })

	h := f.history(relLease, nil)
	sc := newStateChecker(state, relNamespace)
	var kills []int64
	var stderrs []string
	var restarts []restartSnapshot
	planted, tornTails := 0, 0
	for len(kills) < crashes {
		time.Sleep(time.Duration(600+rand.IntN(1000)) * time.Millisecond)
		wallKill, kill := time.Now(), monoNow()
		d.kill()
		kills = append(kills, kill)
		stderrs = append(stderrs, d.stderr())

		// The crash state: what the dead daemon left on disk.
		f.mu.Lock()
		for id, c := range f.clients {
			h.clients[id] = c
		}
		f.mu.Unlock()
		if err := h.load(); err != nil {
			t.Fatalf("reading client logs: %v", err)
		}
		leftovers := sc.scan(h.tokens())
		tornPlanted := false
		if len(kills)%10 == 0 {
			if p := sc.plantTempFile(); p != "" {
				leftovers = append(leftovers, p)
				planted++
			}
		}
		if len(kills)%5 == 2 {
			tornPlanted = sc.plantTornJournal()
		}
		before := lsStateJSON(t, state)

		d = startDaemon(t, daemonOpts{mountpoint: mp, state: state, leaseDuration: relLease})
		if tornPlanted {
			tornTails++
			if !strings.Contains(d.stderr(), "dropping the torn tail of the journal") {
				sc.add("torn journal tail not detected", "crash %d: the restarted daemon did not log dropping it", len(kills))
			}
		}
		after := lsStateJSON(t, state)
		restarts = append(restarts, restartSnapshot{kill: kill, wallKill: wallKill, listed: monoNow(), before: before, after: after})
		for _, p := range leftovers {
			if _, err := os.Lstat(p); err == nil {
				sc.add("temporary file survived the restart", "%s (left by crash %d)", p, len(kills))
			}
		}
		// A change written behind (docs/PROTOCOL.md §4.3) may be in the
		// journal only: what counts is the state after the restart's
		// replay, which writes it to its record.
		sc.scanServed(h.tokens())
		sc.verifyAcknowledged(h, kill, len(kills))
	}
	cancel()
	<-chaosDone
	f.stop()
	// Let the daemon's reaper end the token leases that expire now that
	// nobody renews them, so that every lease is in ls or history.
	time.Sleep(relLease + 500*time.Millisecond)
	d.stop(true)
	stderrs = append(stderrs, d.stderr())
	for _, e := range f.errs {
		t.Error(e)
	}

	h = f.history(relLease, kills)
	if err := h.load(); err != nil {
		t.Fatalf("reading client logs: %v", err)
	}
	tokens := h.tokens()
	sc.scan(tokens)
	sc.finalChecks(t, h, tokens, restarts, stderrs)

	recordFigure("daemon crashes", "daemon SIGKILLs survived (restarted on the same state and mountpoint)", len(kills))
	recordFigure("daemon crashes", "acknowledged changes verified after a restart", sc.verified)
	recordFigure("daemon crashes", "record files parsed", sc.parsed)
	recordFigure("daemon crashes", "temporary files left by a crash, removed at restart", sc.tempSeen)
	recordFigure("daemon crashes", "half-written pending records planted, removed at restart", planted)
	recordFigure("daemon crashes", "torn journal tails planted, dropped at restart", tornTails)
	recordFigure("daemon crashes", "token leases whose heartbeat was compared across a restart", sc.heartbeats)
	recordFigure("daemon crashes", "violations", len(sc.violations))
	if len(sc.violations) > 0 {
		t.Errorf("daemon crashes: %d violations:\n%s", len(sc.violations), sc.describe(40))
	}
	t.Logf("daemon crashes: %d crashes, %d acknowledged changes verified, %d records parsed, %d temporary files cleaned, %d heartbeats compared",
		len(kills), sc.verified, sc.parsed, sc.tempSeen, sc.heartbeats)

	r := h.check(logDir)
	reportMutualExclusion(t, "mutual exclusion under daemon crashes", f, h, r)
	if t.Failed() {
		// The daemons' own account of the refusals a client did not expect;
		// their whole logs are kept beside the clients'.
		for i, s := range stderrs {
			_ = os.WriteFile(filepath.Join(logDir, fmt.Sprintf("daemon-%02d.log", i)), []byte(s), 0o644)
			for _, line := range strings.Split(s, "\n") {
				if strings.Contains(line, "errno=EIO") || strings.Contains(line, "level=ERROR") {
					t.Logf("daemon %d: %s", i, line)
				}
			}
		}
	}
}

// TestReliabilityWaiterFstat is the case the flock(1) clients of the
// mutual-exclusion run found: a waiter granted the name is re-bound to its new
// lease, and fstat through its descriptor must describe that lease (docs/OPERATIONS.md,
// "Handle leases") even while other descriptors are open on the inode it
// opened — another waiter's, or a plain reader's. The kernel sends fstat per
// inode, not per descriptor, so the plain reader's fstat describes the same
// re-bound lease; its read, which is per descriptor, answers ESTALE.
func TestReliabilityWaiterFstat(t *testing.T) {
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "job")
	env := "P=" + p
	holder := startPy(t, `
import fcntl
fd = os.open(os.environ["P"], os.O_CREAT | os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
out("held", 1)
sys.stdin.readline()
fcntl.flock(fd, fcntl.LOCK_UN)
out("released", 1)
sys.stdin.readline()
`, env)
	holder.expectKey("held", 10*time.Second)
	const waiter = `
import fcntl
fd = os.open(os.environ["P"], os.O_RDWR)
out("opened", 1)
fcntl.flock(fd, fcntl.LOCK_EX)
doc = os.pread(fd, 8192, 0).decode()
out("lease", [l for l in doc.splitlines() if l.startswith("lease_id")][0])
st, res = call(os.fstat, fd)
out("fstat", res)
out("size", st.st_size if st else -1)
out("docsize", len(doc))
sys.stdin.readline()
os.close(fd)
`
	waiting := func(n int) {
		eventually(t, 10*time.Second, fmt.Sprintf("%d waiters on %s", n, p), func() (bool, string) {
			st, doc := statusDoc(t, p)
			return st["waiters"] == fmt.Sprint(n), doc
		})
	}
	w1 := startPy(t, waiter, env)
	w1.expectKey("opened", 10*time.Second)
	waiting(1)
	w2 := startPy(t, waiter, env)
	w2.expectKey("opened", 10*time.Second)
	waiting(2)
	reader := startPy(t, `
fd = os.open(os.environ["P"], os.O_RDONLY)
out("opened", 1)
sys.stdin.readline()
out("fstat", err(os.fstat, fd))
out("pread", err(os.pread, fd, 10, 0))
`, env)
	reader.expectKey("opened", 10*time.Second)

	holder.send("")
	holder.expectKey("released", 10*time.Second)
	for i, w := range []*bgProc{w1, w2} {
		w.expectKey("docsize", 10*time.Second)
		if i == 0 {
			reader.send("")
			if got := reader.expectKey("fstat", 10*time.Second); got != "ok" {
				t.Errorf("fstat of an inode whose granted waiter holds the name: %s, want ok", got)
			}
			if got := reader.expectKey("pread", 10*time.Second); got != "ESTALE" {
				t.Errorf("pread of a descriptor whose lease ended: %s, want ESTALE", got)
			}
		}
		kv := w.kv()
		if kv["fstat"] != "ok" || kv["size"] != kv["docsize"] {
			t.Errorf("waiter %d granted %s while %d other descriptor(s) share its inode: fstat = %s (st_size %s, status document %s bytes), want ok describing its new lease",
				i+1, kv["lease"], 2-i, kv["fstat"], kv["size"], kv["docsize"])
		}
		w.send("")
	}
}
