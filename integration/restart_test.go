package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/internal/testenv"
)

// Handle leases across daemon restarts (docs/PROTOCOL.md §2, "Handle leases
// across restarts"): a handle lease lives while its open file lives,
// whatever happens to the daemon.

// survivorGrant bounds how long after its last holder's exit a surviving
// handle lease's name is free again: PROTOCOL says within a second; the
// margin is for a loaded CI machine under -race.
const survivorGrant = 3 * time.Second

// holderKinds are the ways a shell or Python program holds a handle lease,
// each waiting until the file $GO exists. Every script prints "held" once it
// holds the lock.
var holderKinds = []struct {
	name   string
	python bool
	script string
}{
	// flock(1) running a command.
	{name: "flock-cmd", script: `flock -n "$P" sh -c 'echo held; while [ ! -e "$GO" ]; do sleep 0.05; done'`},
	// The subshell idiom of flock(1)'s manual.
	{name: "fd9-idiom", script: `( flock -n 9 || exit 1; echo held; while [ ! -e "$GO" ]; do sleep 0.05; done ) 9>"$P"`},
	// A child that inherited the descriptor after its parent exited.
	{name: "inherited", script: `exec 9>"$P"; flock -n 9 || exit 1; ( while [ ! -e "$GO" ]; do sleep 0.05; done ) & echo "child $!"; echo held; exit 0`},
	// Python's fcntl.flock on os.open.
	{name: "python", python: true, script: `
import fcntl, time
fd = os.open(os.environ["P"], os.O_CREAT | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
while not os.path.exists(os.environ["GO"]):
    time.sleep(0.05)
out("read", err(os.pread, fd, 4096, 0))
`},
}

// TestHandleLeasesSurviveRestart holds a name in each of [holderKinds]
// while the daemon is stopped (SIGTERM), killed (SIGKILL) or replaced
// (--takeover), then started again: each name stays held, with the same
// lease id, until its holder lets go, and is free within a second after;
// a holder that exits while no daemon runs leaves its name free once one
// is back.
func TestHandleLeasesSurviveRestart(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	for _, stop := range []string{"sigterm", "sigkill", "takeover"} {
		t.Run(stop, func(t *testing.T) {
			t.Parallel()
			d1 := startDaemon(t, daemonOpts{})
			signals := t.TempDir()
			type held struct {
				p, id, goFile string
				proc          *bgProc
			}
			var holders []held
			start := func(name, script string, python bool) held {
				h := held{p: filepath.Join(d1.mountpoint, name), goFile: filepath.Join(signals, "go-"+name)}
				env := []string{"P=" + h.p, "GO=" + h.goFile}
				if python {
					h.proc = startPy(t, script, env...)
				} else {
					h.proc = startProc(t, env, "bash", "-c", script)
				}
				h.proc.expect(`(?m)^held$`, holdTimeout)
				st, _ := statusDoc(t, h.p)
				wantHandle(t, st, name)
				h.id = st["lease_id"]
				return h
			}
			for _, k := range holderKinds {
				holders = append(holders, start(k.name, k.script, k.python))
			}
			early := start("exits-while-down", holderKinds[0].script, false)

			var d2 *daemon
			switch stop {
			case "sigterm":
				d1.stop(true)
			case "sigkill":
				d1.kill()
			case "takeover":
				d2 = startDaemon(t, daemonOpts{mountpoint: d1.mountpoint, state: d1.state, takeover: true})
				if code, exited := d1.waitExit(15 * time.Second); !exited || code != 0 {
					t.Fatalf("the daemon handing over: exited %v, code %d; stderr:\n%s", exited, code, d1.stderr())
				}
			}
			if d2 == nil && stop == "sigkill" {
				// With no daemon, ls and status read the store (the
				// records, or the cluster) and /proc.
				for _, h := range holders {
					e := findLease(cliJSON(t, "ls", "--state", d1.state, "--json"), h.id)
					if e == nil || e["daemon"] != "previous" || e["holder_pids"] == "" {
						t.Errorf("ls with no daemon: %s is %v, want it live with daemon = previous and holder_pids", filepath.Base(h.p), e)
					}
				}
				if r := runClient(t, nil, leasefsBin, "ls", "--state", d1.state); strings.Count(r.stdout, "handle (previous daemon)") != len(holders)+1 {
					t.Errorf("ls with no daemon: %s\nwant %d rows of mode handle (previous daemon), the early holder's included", r, len(holders)+1)
				}
				if r := runClient(t, nil, leasefsBin, "status", "--state", d1.state); !strings.Contains(r.stdout, "previous daemon: 5 handle leases") {
					t.Errorf("status with no daemon: %s\nwant the 5 handle leases of the previous daemon", r)
				}
			}
			if d2 == nil {
				touch(t, early.goFile)
				early.proc.wait(holdTimeout)
				d2 = startDaemon(t, daemonOpts{mountpoint: d1.mountpoint, state: d1.state, metricsAddr: "127.0.0.1:0"})
				got, body := scrapeMetrics(t, d2.metricsURL(t))
				if n := got["leasefs_previous_daemon_handle_leases"]; n != float64(len(holders)) {
					t.Errorf("leasefs_previous_daemon_handle_leases = %v after the restart, want %d\n%s", n, len(holders), body)
				}
			} else {
				holders = append(holders, early) // no time without a daemon: it is one more survivor
			}
			for _, h := range holders {
				if strings.Contains(d2.stderr(), h.id) && !strings.Contains(d2.stderr(), `msg="handle lease kept" resource=`+filepath.Base(h.p)) {
					t.Errorf("the new daemon did not keep %s, still held; stderr:\n%s", filepath.Base(h.p), d2.stderr())
				}
			}
			for _, h := range holders {
				st, _ := statusDoc(t, h.p)
				if st["lease_id"] != h.id || st["status"] != "active" || st["daemon"] != "previous" {
					t.Errorf("%s after the restart: %v, want %s active with daemon = previous", filepath.Base(h.p), st, h.id)
				}
				if r := sh(t, `flock -n "$P" true`, "P="+h.p); r.code == 0 {
					t.Errorf("%s: a second flock -n was granted while the first holder still holds it\nstderr:\n%s", filepath.Base(h.p), d2.stderr())
				}
			}
			for _, h := range holders {
				touch(t, h.goFile)
				h.proc.wait(holdTimeout)
				if m := h.proc.stdout.String(); strings.Contains(m, "child ") {
					// The child that inherited the descriptor, not the
					// shell that exited at once, held it.
					child := regexp.MustCompile(`child (\d+)`).FindStringSubmatch(m)[1]
					eventually(t, holdTimeout, "the inherited descriptor's holder to exit", func() (bool, string) {
						return sh(t, `! kill -0 "$C" 2>/dev/null`, "C="+child).code == 0, ""
					})
				}
				exited := time.Now()
				if strings.HasSuffix(h.p, "python") {
					if got := h.proc.kv()["read"]; got != "ENOTCONN" {
						t.Errorf("the Python holder's read on its descriptor of the previous daemon's mount: %s, want ENOTCONN", got)
					}
				}
				eventually(t, survivorGrant, filepath.Base(h.p)+" free after its holder exited", func() (bool, string) {
					r := sh(t, `flock -n "$P" true`, "P="+h.p)
					return r.code == 0, r.String()
				})
				t.Logf("%s: free %v after its holder exited", filepath.Base(h.p), time.Since(exited).Round(time.Millisecond))
			}
			if stop != "takeover" {
				if r := sh(t, `flock -n "$P" true`, "P="+early.p); r.code != 0 {
					t.Errorf("the name whose holder exited while no daemon ran: %s, want it free", r)
				}
			}
			if code := d2.stop(true); code != 0 {
				t.Errorf("the restarted daemon exited %d", code)
			}
		})
	}
}

// touch creates an empty file at p.
func touch(t testing.TB, p string) {
	t.Helper()
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLockAcrossRestart runs `leasefs lock` with a command that finishes
// after the daemon was stopped (SIGTERM) or killed (SIGKILL) and started
// again: the command keeps running, lock takes the same lease back through
// a new open file and exits with the command's status 0, and the name was
// never free meanwhile. A lock SIGKILLed after taking its lease back frees
// the name within a second.
func TestLockAcrossRestart(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	for _, stop := range []string{"sigterm", "sigkill"} {
		t.Run(stop, func(t *testing.T) {
			t.Parallel()
			d1 := startDaemon(t, daemonOpts{})
			dir := t.TempDir()
			goFile, done := filepath.Join(dir, "go"), filepath.Join(dir, "done")
			script := `echo "id $LEASEFS_LEASE_ID"; while [ ! -e "$GO" ]; do sleep 0.05; done; touch "$DONE"`
			job := startProc(t, []string{"GO=" + goFile, "DONE=" + done},
				leasefsBin, "lock", "--mount", d1.mountpoint, "job", "--", "bash", "-c", script)
			id := job.expect(`(?m)^id (lease-\S+)$`, holdTimeout)[1]
			// A second holder: SIGKILLed once it has its lease back.
			killed := lockHolder(t, d1, "killed")
			killedSt, _ := statusDoc(t, filepath.Join(d1.mountpoint, "killed"))

			if stop == "sigterm" {
				d1.stop(true)
			} else {
				d1.kill()
			}
			d2 := startDaemon(t, daemonOpts{mountpoint: d1.mountpoint, state: d1.state})
			p := filepath.Join(d2.mountpoint, "job")
			eventually(t, holdTimeout, "lock to take its lease back", func() (bool, string) {
				return strings.Contains(job.stderr.String(), "taken back"), job.stderr.String()
			})
			if st, _ := statusDoc(t, p); st["lease_id"] != id || st["daemon"] != "" {
				t.Errorf("job after lock took it back: %v, want %s bound to the new daemon (no daemon field)", st, id)
			}
			if r := sh(t, `flock -n "$P" true`, "P="+p); r.code == 0 {
				t.Errorf("flock -n on the name lock holds was granted after the restart")
			}
			touch(t, goFile)
			r := job.wait(holdTimeout)
			if r.code != 0 {
				t.Errorf("lock across the restart: %s\nwant exit 0", r)
			}
			if _, err := os.Stat(done); err != nil {
				t.Errorf("the command's work after the restart: %v", err)
			}
			if !strings.Contains(d2.stderr(), `msg="handle lease taken back" resource=job lease=`+id) {
				t.Errorf("the new daemon did not log the take-back of %s; stderr:\n%s", id, d2.stderr())
			}

			kp := filepath.Join(d2.mountpoint, "killed")
			eventually(t, holdTimeout, "the second lock to take its lease back", func() (bool, string) {
				return strings.Contains(killed.stderr.String(), "taken back"), killed.stderr.String()
			})
			if st, _ := statusDoc(t, kp); st["lease_id"] != killedSt["lease_id"] {
				t.Errorf("the second lock's lease after the restart: %v, want %s", st, killedSt["lease_id"])
			}
			killed.signal(syscall.SIGKILL)
			killed.wait(holdTimeout)
			freed := eventually(t, time.Second, "the name of a SIGKILLed lock free within a second", func() (bool, string) {
				r := sh(t, `flock -n "$P" true`, "P="+kp)
				return r.code == 0, r.String()
			})
			t.Logf("job taken back; the SIGKILLed lock's name free after %v", freed)
		})
	}
}

// TestEtcdLockStopsCommandBeforeTheClusterExpiresIt SIGKILLs the daemon of
// a `leasefs lock` on etcd and does not start it again: lock stops its
// command (exit 4) before the cluster expires the lease and grants the name
// to a flock(1) waiter through another mount (docs/PROTOCOL.md §8: lock's
// deadline is the lease's keepalive_until, which comes at least the margin
// of §8a before the cluster's expiry).
func TestEtcdLockStopsCommandBeforeTheClusterExpiresIt(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	testenv.RequireFUSE(t)
	srv := etcdtest.Start(t)
	store := []string{"--store", "etcd://" + srv.Endpoint() + "/leasefs-away"}
	a := startDaemon(t, daemonOpts{extraArgs: store, leaseDuration: 3 * time.Second})
	b := startDaemon(t, daemonOpts{extraArgs: store, leaseDuration: 3 * time.Second})
	dir := t.TempDir()
	stopped, granted := filepath.Join(dir, "stopped"), filepath.Join(dir, "granted")
	job := startProc(t, []string{"STOPPED=" + stopped}, leasefsBin, "lock", "--grace", "500ms", "--mount", a.mountpoint, "job", "--",
		"bash", "-c", `trap 'date +%s.%N > "$STOPPED"; exit 143' TERM; echo held; while :; do sleep 0.05; done`)
	job.expect(`(?m)^held$`, holdTimeout)
	waiter := startProc(t, []string{"P=" + filepath.Join(b.mountpoint, "job"), "GRANTED=" + granted},
		"bash", "-c", `flock "$P" sh -c 'date +%s.%N > "$GRANTED"'`)
	waitWaiters(t, filepath.Join(b.mountpoint, "job"), 1)

	killedAt := time.Now()
	a.kill()
	r := job.wait(30 * time.Second)
	if r.code != 4 {
		t.Errorf("lock whose daemon stayed away past the TTL: %s\nwant exit 4", r)
	}
	waiter.wait(30 * time.Second)
	at := func(p string) time.Time {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(p), err)
		}
		secs, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		if err != nil {
			t.Fatal(err)
		}
		return time.Unix(0, int64(secs*1e9))
	}
	s, g := at(stopped), at(granted)
	t.Logf("daemon killed; command stopped %v later, the other mount's waiter granted %v later",
		s.Sub(killedAt).Round(time.Millisecond), g.Sub(killedAt).Round(time.Millisecond))
	if !s.Before(g) {
		t.Errorf("the command was stopped at %s, not before the other mount's waiter was granted at %s", s, g)
	}
}
