package integration

import (
	"bufio"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/internal/testenv"
)

// TestSignalsNeverFailCalls runs lease cycles, renewals, handle cycles,
// stat, getxattr and reads of the status document from clients whose
// calls are interrupted all the time, and requires every call to succeed
// (docs/PROTOCOL.md §3, "Interrupted calls"): a Go client (8 goroutines,
// which the runtime preempts with SIGURG, and a 1 ms interval timer) and a
// Python client with a 1 ms interval timer, on one mount, for 4 s. The
// kernel sends FUSE_INTERRUPT for a request whose caller gets a signal;
// only a blocking lock wait may end with it, and the kernel restarts that
// one for both clients. It runs on the pass's store and, in the file pass,
// on an embedded etcd server too.
func TestSignalsNeverFailCalls(t *testing.T) {
	testenv.RequireFUSE(t)
	python := requireTool(t, "python3")
	bin := filepath.Join(t.TempDir(), "sigclient")
	if out, err := exec.Command("go", "build", "-o", bin, "./testdata/sigclient").CombinedOutput(); err != nil {
		t.Fatalf("go build testdata/sigclient: %v\n%s", err, out)
	}
	script, err := filepath.Abs("testdata/sigclient/sigclient.py")
	if err != nil {
		t.Fatal(err)
	}
	stores := map[string]func(t *testing.T) []string{
		"pass": func(*testing.T) []string { return nil },
	}
	if !etcdPass() {
		stores["etcd-embedded"] = func(t *testing.T) []string {
			return []string{"--store", "etcd://" + etcdtest.Start(t).Endpoint() + "/signals"}
		}
	}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			d := startDaemon(t, daemonOpts{extraArgs: store(t)})
			pyc := startProc(t, nil, python, script, d.mountpoint, "4", "0.001")
			goc := runClient(t, nil, bin, d.mountpoint, "4s", "8", "1ms")
			pyr := pyc.wait(clientTimeout)
			for _, c := range []struct {
				name string
				r    result
			}{{"go", goc}, {"python", pyr}} {
				kv := keyValues(c.r.stdout)
				calls, _ := strconv.Atoi(kv["calls"])
				if c.r.code != 0 || kv["failed"] != "0" || calls < 100 {
					t.Errorf("%s client: %d calls, %s failed (want at least 100, none failed): %s\ndaemon:\n%s",
						c.name, calls, kv["failed"], c.r, tail(d.stderr(), 4000))
				} else {
					t.Logf("%s client: %d calls, none failed", c.name, calls)
				}
			}
		})
	}
}

// keyValues parses KEY=VALUE lines.
func keyValues(out string) map[string]string {
	kv := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[k] = v
		}
	}
	return kv
}
