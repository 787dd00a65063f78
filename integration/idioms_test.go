package integration

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/testenv"
)

// idiomProcs and idiomIterations are the load of TestLockLibraryIdioms:
// each idiom runs in that many processes at once, each that many times.
// The etcd pass runs a third of the iterations: 300 take two minutes
// there with the race detector on two cores, a sixth of CI's budget. The
// CI form (-short, CONTRIBUTING.md) runs half of them on the file store.
const (
	idiomProcs      = 4
	idiomIterations = 300
)

// idiomRuns is how many times each process runs its idiom in this pass.
func idiomRuns() int {
	switch {
	case etcdPass():
		return idiomIterations / 3
	case testing.Short():
		return idiomIterations / 2
	}
	return idiomIterations
}

// TestLockLibraryIdioms runs the open-and-lock idioms of real lock
// libraries, each in four processes × 300 iterations on one name (100 in
// the etcd pass), all idioms at once on the pass's store, and requires
// every iteration to be accounted for, with no failed call
// (docs/PROTOCOL.md §3, "Opening a path"; §6, "Lock libraries"): an open
// with O_TRUNC, O_APPEND or O_CREAT, and the fstat, lseek and ftruncate
// right after it, never fail with ESTALE whatever ends meanwhile, and no
// reservation is left that no descriptor holds. The clients: Python's lock
// libraries themselves (Debian's python3-filelock 3.9, fasteners 0.17,
// portalocker 2.2: FileLock, InterProcessLock, and Lock in mode "w" with
// the holder's pid written while locked) and a blocking O_TRUNC + fstat +
// flock, all with a 1 ms interval timer; the flock(1) man page's
// `( flock -n 9 ) 9>FILE` and the same with `flock -w`, whose timeouts
// interrupt waits that may be granted meanwhile; and a Go client (O_TRUNC
// + fstat + lseek + blocking flock; O_APPEND + fstat + ftruncate + fcntl
// F_SETLK) with a 1 ms timer and the runtime's SIGURG; meanwhile an rm
// loop ends the fasteners and fcntl clients' leases under them. Afterwards
// every name is free on the mount and in the store.
func TestLockLibraryIdioms(t *testing.T) {
	testenv.RequireFUSE(t)
	python := requireTool(t, "python3")
	requireTool(t, "flock")
	bin := filepath.Join(t.TempDir(), "idioms")
	if out, err := exec.Command("go", "build", "-o", bin, "./testdata/idioms").CombinedOutput(); err != nil {
		t.Fatalf("go build testdata/idioms: %v\n%s", err, out)
	}
	script, err := filepath.Abs("testdata/idioms/idioms.py")
	if err != nil {
		t.Fatal(err)
	}
	libraries, err := filepath.Abs("testdata/idioms/libraries.py")
	if err != nil {
		t.Fatal(err)
	}
	// The libraries themselves, from Debian's packages, for the Python
	// that Debian's packages install into.
	debPython := otherPython(t)
	if out, err := exec.Command(debPython, "-c", "import filelock, fasteners, portalocker").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import Python's lock libraries (apt-get install python3-filelock python3-fasteners python3-portalocker): %v\n%s", debPython, err, out)
	}
	d := startDaemon(t, daemonOpts{metricsAddr: "127.0.0.1:0", extraArgs: []string{"--pprof"}})
	m := d.mountpoint
	pprof := strings.TrimSuffix(d.metricsURL(t), "/metrics") + "/debug/pprof/goroutine?debug=1"
	runs := idiomRuns()
	n := strconv.Itoa(runs)
	// The man page's idiom: the subshell's `9>FILE` opens with
	// O_WRONLY|O_CREAT|O_TRUNC, flock(1) locks the inherited descriptor.
	const manPage = `ok=0 busy=0 failed=0
for i in $(seq "$N"); do
  ( flock $FLAGS 9; rc=$?; [ $rc -eq 0 ] && exit 0; [ $rc -eq 1 ] && exit 3; exit 1 ) 9>"$F" 2>>"$ERR"
  case $? in 0) ok=$((ok+1));; 3) busy=$((busy+1));; *) failed=$((failed+1));; esac
done
printf 'ok=%d\nbusy=%d\nfailed=%d\n' $ok $busy $failed
if [ -s "$ERR" ]; then echo "# stderr:"; head -5 "$ERR"; fi`
	type idiom struct {
		name     string
		blocking bool // every iteration must acquire
		argv     func(i int, path string) ([]string, []string)
	}
	idioms := []idiom{
		{"py-blocking", true, func(_ int, p string) ([]string, []string) { return nil, []string{python, script, "blocking", p, n} }},
		{"lib-filelock", false, func(_ int, p string) ([]string, []string) {
			return nil, []string{debPython, libraries, "filelock", p, n}
		}},
		{"lib-fasteners", false, func(_ int, p string) ([]string, []string) {
			return nil, []string{debPython, libraries, "fasteners", p, n}
		}},
		{"lib-portalocker", false, func(_ int, p string) ([]string, []string) {
			return nil, []string{debPython, libraries, "portalocker", p, n}
		}},
		{"go-trunc", true, func(_ int, p string) ([]string, []string) { return nil, []string{bin, "trunc", p, n} }},
		{"go-append", false, func(_ int, p string) ([]string, []string) { return nil, []string{bin, "append", p, n} }},
		{"flock-n", false, func(i int, p string) ([]string, []string) {
			return []string{"N=" + n, "F=" + p, "FLAGS=-n", fmt.Sprintf("ERR=%s/flock-n-%d.err", t.TempDir(), i)}, []string{"bash", "-c", manPage}
		}},
		// A timeout of 20 ms: many waits time out, some just as they are
		// granted, and those grants must end at once (§6).
		{"flock-w", false, func(i int, p string) ([]string, []string) {
			return []string{"N=" + n, "F=" + p, "FLAGS=-w 0.02", fmt.Sprintf("ERR=%s/flock-w-%d.err", t.TempDir(), i)}, []string{"bash", "-c", manPage}
		}},
	}
	type run struct {
		idiom idiom
		proc  *bgProc
	}
	var procs []run
	start := time.Now()
	for _, id := range idioms {
		for i := range idiomProcs {
			env, argv := id.argv(i, filepath.Join(m, id.name))
			procs = append(procs, run{id, startProc(t, env, argv...)})
		}
	}
	// Root's rm ends fasteners' and the Go fcntl client's leases under
	// them, between their opens and their locks too: a lock then takes the
	// free name, never ESTALE (§6).
	racer := startProc(t, []string{"A=" + filepath.Join(m, "lib-fasteners"), "B=" + filepath.Join(m, "go-append")},
		"bash", "-c", `for i in $(seq 1500); do rm -f "$A" "$B"; sleep 0.002; done`)
	// Registered after the clients' own cleanups, so that it runs before
	// they are killed: what the daemon was doing while a client hung.
	t.Cleanup(func() {
		if t.Failed() {
			dumpDaemon(t, d, pprof)
		}
	})
	for _, r := range procs {
		res := r.proc.wait(3 * time.Minute)
		kv := keyValues(res.stdout)
		ok, _ := strconv.Atoi(kv["ok"])
		busy, _ := strconv.Atoi(kv["busy"])
		switch {
		case res.code != 0 || kv["failed"] != "0" || ok+busy != runs:
			t.Errorf("%s: ok %d + busy %d of %d iterations, %s failed: %s", r.idiom.name, ok, busy, runs, kv["failed"], res)
		case r.idiom.blocking && ok != runs:
			t.Errorf("%s: acquired %d of %d times with a blocking lock: %s", r.idiom.name, ok, runs, res)
		case ok == 0:
			t.Errorf("%s: never acquired in %d iterations: %s", r.idiom.name, runs, res)
		}
	}
	if res := racer.wait(3 * time.Minute); res.code != 0 {
		t.Errorf("the rm loop: %s", res)
	}
	t.Logf("%d idioms × %d processes × %d iterations in %v", len(idioms), idiomProcs, runs, time.Since(start).Round(time.Millisecond))
	// The last release reaches the daemon just after the last close.
	eventually(t, 10*time.Second, "every name free on the mount and in the store", func() (bool, string) {
		names := listMount(t, m)
		var held []string
		for _, e := range cliJSON(t, "ls", "--state", d.state, "--json") {
			held = append(held, fmt.Sprintf("%v (%v, pid %v)", e["resource"], e["mode"], e["holder_pid"]))
		}
		return len(names) == 0 && len(held) == 0, fmt.Sprintf("mount lists %q, store holds %s", names, strings.Join(held, ", "))
	})
	if logs := d.stderr(); strings.Contains(logs, "level=ERROR") {
		t.Errorf("the daemon logged errors:\n%s", tail(logs, 4000))
	}
}

// dumpDaemon logs what a failed test needs to tell a hang from a refusal:
// the daemon's goroutines (from its pprof endpoint), what the store holds,
// and the end of the daemon's log.
func dumpDaemon(t *testing.T, d *daemon, pprof string) {
	if code, body := httpGet(t, pprof); code == 200 {
		t.Logf("the daemon's goroutines:\n%s", tail(string(body), 30000))
	}
	if out, err := exec.Command(leasefsBin, "ls", "--state", d.state, "--json").CombinedOutput(); err == nil {
		t.Logf("leasefs ls --json: %s", out)
	}
	t.Logf("the daemon's log, last lines:\n%s", tail(d.stderr(), 20000))
}
