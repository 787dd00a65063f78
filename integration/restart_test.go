package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
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
			if d2 == nil {
				touch(t, early.goFile)
				early.proc.wait(holdTimeout)
				d2 = startDaemon(t, daemonOpts{mountpoint: d1.mountpoint, state: d1.state})
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
