package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/leasefs/leasefs/internal/testenv"
)

// gofrsFlock is the module whose own test suite TestGofrsFlockSuite runs
// on a mount, fetched from the Go module proxy at test time.
const gofrsFlock = "github.com/gofrs/flock@v0.13.2"

// gofrsExpectedFailures are the tests of gofrsFlock that fail on a lease
// mount, each for a documented reason (docs/PROTOCOL.md §6, "Lock
// libraries"): shared locks get ENOLCK, and a released lock file no longer
// exists (its Stat after Unlock gets ENOENT).
var gofrsExpectedFailures = []string{
	"Test/TestFlock_RLock",
	"Test/TestFlock_Stat",
	"Test/TestFlock_TryRLock",
	"Test/TestFlock_TryRLockContext",
}

// TestGofrsFlockSuite runs gofrs/flock's own test suite with its
// temporary files on a mount (TMPDIR is the mountpoint: every test locks a
// file in a namespace of its own) and requires every test to pass but the
// documented refusals, which must fail: a pass there would mean the suite
// did not run on the mount.
func TestGofrsFlockSuite(t *testing.T) {
	testenv.RequireFUSE(t)
	out, err := exec.Command("go", "mod", "download", "-json", gofrsFlock).Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v\n%s", gofrsFlock, err, out)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download -json %s: no directory in %s (%v)", gofrsFlock, out, err)
	}
	bin := filepath.Join(t.TempDir(), "flock.test")
	build := exec.Command("go", "test", "-c", "-o", bin, ".")
	build.Dir = mod.Dir
	build.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c in %s: %v\n%s", mod.Dir, err, out)
	}
	d := startDaemon(t, daemonOpts{})
	r := runClient(t, []string{"TMPDIR=" + d.mountpoint}, bin, "-test.v", "-test.count=1", "-test.timeout=60s")
	results := regexp.MustCompile(`(?m)^\s*--- (PASS|FAIL): (\S+)`).FindAllStringSubmatch(r.stdout, -1)
	var passed, failed []string
	for _, m := range results {
		if !strings.Contains(m[2], "/") && m[1] == "FAIL" {
			continue // a suite fails when one of its tests does
		}
		if m[1] == "PASS" {
			passed = append(passed, m[2])
		} else {
			failed = append(failed, m[2])
		}
	}
	slices.Sort(failed)
	if !slices.Equal(failed, gofrsExpectedFailures) || len(passed) < 20 {
		t.Errorf("gofrs/flock's suite on the mount: failed %q, want exactly %q; %d passed (want at least 20)\n%s",
			failed, gofrsExpectedFailures, len(passed), tail(r.stdout, 6000))
	} else {
		t.Logf("gofrs/flock's suite on the mount: %d passed, %d documented refusals failed as expected", len(passed), len(failed))
	}
}
