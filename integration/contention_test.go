package integration

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// pyContender loops $N times on $P in one of four ways ($KIND) and prints
// out("failures", …) with every unexpected errno of an open or a lock:
// flock over O_RDWR or O_RDONLY opens with O_CREAT, lockf over an O_RDWR
// O_CREAT open, or plain opens without O_CREAT of a name that is released
// and re-reserved all the time (ENOENT is their one acceptable refusal).
const pyContender = `
import fcntl
p, kind, n = os.environ["P"], os.environ["KIND"], int(os.environ["N"])
failures = []
for i in range(n):
    flags = {"flock_rdwr": os.O_CREAT | os.O_RDWR, "flock_rdonly": os.O_CREAT | os.O_RDONLY,
             "lockf": os.O_CREAT | os.O_RDWR, "plain": os.O_RDONLY}[kind]
    fd, e = call(os.open, p, flags, 0o644)
    if e != "ok":
        if not (kind == "plain" and e == "ENOENT"):
            failures.append("open:" + e)
        continue
    if kind == "lockf":
        e = err(fcntl.lockf, fd, fcntl.LOCK_EX)
        if e == "ok":
            e = err(fcntl.lockf, fd, fcntl.LOCK_UN)
    elif kind != "plain":
        e = err(fcntl.flock, fd, fcntl.LOCK_EX)
        if e == "ok":
            e = err(fcntl.flock, fd, fcntl.LOCK_UN)
    if e != "ok":
        failures.append("lock:" + e)
    os.close(fd)
out("failures", " ".join(failures))
out("done", n)
`

// A path open never fails with ESTALE, however often the lease the kernel
// looked up ends before the open reaches the daemon: 16 processes queue on
// one name with every kind of open and lock, and none of their opens or
// locks fails.
func TestContendedOpensNeverStale(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "queue")
	// Each cycle is a few cluster round trips in the etcd pass (its queue
	// hands the name on through the watch), so that pass runs fewer.
	iterations := 200
	if etcdPass() {
		iterations = 25
	}
	kinds := []string{"flock_rdwr", "flock_rdwr", "flock_rdwr", "flock_rdwr", "flock_rdwr",
		"flock_rdonly", "flock_rdonly", "flock_rdonly", "flock_rdonly",
		"lockf", "lockf", "lockf", "lockf",
		"plain", "plain", "plain"}
	procs := make([]*bgProc, len(kinds))
	for i, kind := range kinds {
		procs[i] = startPy(t, pyContender, "P="+p, "KIND="+kind, "N="+strconv.Itoa(iterations))
	}
	for i, proc := range procs {
		r := proc.wait(5 * clientTimeout)
		if r.code != 0 {
			t.Fatalf("contender %d (%s): %s", i, kinds[i], r)
		}
		kv := proc.kv()
		if kv["done"] != strconv.Itoa(iterations) {
			t.Errorf("contender %d (%s) did not finish: %s", i, kinds[i], r)
		}
		if f := strings.TrimSpace(kv["failures"]); f != "" {
			t.Errorf("contender %d (%s): %d failed calls: %.300s", i, kinds[i], len(strings.Fields(f)), f)
		}
	}
}
