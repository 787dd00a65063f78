package procfs

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/leasefs/leasefs/internal/testenv"
)

func TestStartTicks(t *testing.T) {
	t.Parallel()
	a, ok := StartTicks(os.Getpid())
	if !ok || a == 0 {
		t.Fatalf("StartTicks(self) = %d, %v", a, ok)
	}
	b, ok := StartTicks(os.Getpid())
	if !ok || a != b {
		t.Fatalf("StartTicks(self) not stable: %d then %d", a, b)
	}
	child := testenv.StartSleeper(t)
	c, ok := StartTicks(child.Process.Pid)
	if !ok || c < a {
		t.Errorf("child started at %d (%v), before its parent at %d", c, ok, a)
	}
	for _, pid := range []int{0, -1, testenv.ExitedPID(t)} {
		if ticks, ok := StartTicks(pid); ok {
			t.Errorf("StartTicks(%d) = %d, true; want not ok", pid, ticks)
		}
	}
}

func TestExited(t *testing.T) {
	t.Parallel()
	child := testenv.StartSleeper(t)
	if Exited(os.Getpid()) || Exited(child.Process.Pid) {
		t.Fatal("a running process reported as exited")
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Killed, not yet reaped: a zombie has exited.
	for !Exited(child.Process.Pid) {
		if _, err := os.Stat("/proc/" + strconv.Itoa(child.Process.Pid)); err != nil {
			t.Fatalf("the killed child vanished before it was reaped: %v", err)
		}
	}
	child.Wait()
	if !Exited(child.Process.Pid) || !Exited(testenv.ExitedPID(t)) || !Exited(0) {
		t.Error("a reaped process or pid 0 reported as running")
	}
}

func TestGone(t *testing.T) {
	t.Parallel()
	self := os.Getpid()
	ticks, ok := StartTicks(self)
	if !ok {
		t.Fatal("no /proc")
	}
	tests := []struct {
		name  string
		pid   int
		ticks uint64
		want  bool
	}{
		{"self with its start time", self, ticks, false},
		{"self with unknown start time", self, 0, false},
		{"self with another start time (pid reused)", self, ticks + 1, true},
		{"exited process", testenv.ExitedPID(t), ticks, true},
		{"exited process, unknown start time", testenv.ExitedPID(t), 0, true},
		{"no pid", 0, 0, false},
	}
	for _, tc := range tests {
		if got := Gone(tc.pid, tc.ticks); got != tc.want {
			t.Errorf("%s: Gone(%d, %d) = %v, want %v", tc.name, tc.pid, tc.ticks, got, tc.want)
		}
	}
}

func TestKillPendingAndChildren(t *testing.T) {
	t.Parallel()
	child := testenv.StartSleeper(t)
	for _, pid := range []int{os.Getpid(), child.Process.Pid, 1 << 30} {
		if KillPending(pid) {
			t.Errorf("KillPending(%d) = true, for a running process or no process", pid)
		}
	}
	found := false
	for _, c := range Children(os.Getpid()) {
		found = found || c == child.Process.Pid
	}
	if !found {
		t.Errorf("Children(self) = %v, want it to hold %d", Children(os.Getpid()), child.Process.Pid)
	}
}

func TestBootIDAndHostname(t *testing.T) {
	t.Parallel()
	id := BootID()
	if id != strings.TrimSpace(id) || len(id) != 36 || strings.Count(id, "-") != 4 {
		t.Errorf("BootID() = %q, want a UUID", id)
	}
	if BootID() != id {
		t.Error("BootID not stable")
	}
	h := Hostname()
	if want, err := os.Hostname(); err == nil && want != "" && h != want {
		t.Errorf("Hostname() = %q, want %q from os.Hostname", h, want)
	}
}

// TestExitedIn reads the state of processes from a fake proc: a zombie
// (whose command name holds ") Z") and a missing process have exited, a
// sleeping one has not.
func TestExitedIn(t *testing.T) {
	proc := t.TempDir()
	for pid, stat := range map[int]string{
		7: "7 (a) Z (b) S 1 7 7 0\n",
		8: "8 (sh) S 1 8 8 0\n",
		9: "9 (worker) Z 1 9 9 0\n",
	} {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for pid, want := range map[int]bool{7: false, 8: false, 9: true, 10: true} {
		if got := ExitedIn(proc, pid); got != want {
			t.Errorf("ExitedIn(%d) = %v, want %v", pid, got, want)
		}
	}
}
