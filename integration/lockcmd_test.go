package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// lockCmd runs `leasefs lock ARGS...` and returns its result.
func lockCmd(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return runClient(t, env, append([]string{leasefsBin, "lock"}, args...)...)
}

// lockHolder starts `leasefs lock NAME` on d with a command that holds the
// lease until the test kills its process group, and returns once it holds.
func lockHolder(t *testing.T, d *daemon, name string) *bgProc {
	t.Helper()
	holder := startProc(t, nil, leasefsBin, "lock", "--mount", d.mountpoint, name, "--", "bash", "-c", "echo held; exec sleep 60")
	holder.expect(`(?m)^held$`, holdTimeout)
	return holder
}

// `leasefs lock` runs the command holding a handle lease, tells it the lease
// and fencing token, does not leak the locked descriptor, exits with its
// status and frees the name when it ends.
func TestLockRunsCommand(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "job")
	script := `echo "env $LEASEFS_RESOURCE $LEASEFS_LEASE_ID $LEASEFS_GENERATION"
cat "$P"
for f in /proc/$$/fd/*; do echo "fd $(readlink "$f")"; done
exit 7`
	r := lockCmd(t, []string{"P=" + p}, "--mount", d.mountpoint, "job", "--", "bash", "-c", script)
	if r.code != 7 {
		t.Fatalf("lock exit = %d, want the command's 7: %s", r.code, r)
	}
	var doc strings.Builder
	var env []string
	for line := range strings.SplitSeq(r.stdout, "\n") {
		if strings.Contains(line, " = ") {
			doc.WriteString(line + "\n")
		}
		if rest, ok := strings.CutPrefix(line, "env "); ok {
			env = strings.Fields(rest)
		}
		if strings.HasPrefix(line, "fd ") && strings.Contains(line, d.mountpoint) {
			t.Errorf("the command inherited a descriptor of the mount: %s", line)
		}
	}
	st := parseStatus(t, doc.String())
	if len(env) != 3 || env[0] != "job" || env[1] != st["lease_id"] || env[2] != st["generation"] {
		t.Errorf("command environment %q, status document %v", env, st)
	}
	if st["mode"] != "handle" || st["status"] != "active" {
		t.Errorf("while the command ran the lease was %v, want an active handle lease", st)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("name still held after the command ended: %v", err)
	}
	// A command that cannot be run: 127 when it is not found, 126 when it is not
	// executable, as a shell reports them, and the name is free at once.
	noexec := filepath.Join(t.TempDir(), "noexec")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for cmd, want := range map[string]int{"/nonexistent/cmd": 127, "no-such-command-here": 127, noexec: 126} {
		r := lockCmd(t, nil, "--mount", d.mountpoint, "job", "--", cmd)
		if r.code != want || !strings.Contains(r.stderr, "cannot run") {
			t.Errorf("lock of %s: %s\nwant exit %d and a message", cmd, r, want)
		}
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("name still held after lock of %s failed to run it: %v", cmd, err)
		}
	}
	// An executable script without a #! line runs with /bin/sh, as
	// execvp(3), flock(1) and a shell run it.
	noShebang := filepath.Join(t.TempDir(), "noshebang")
	if err := os.WriteFile(noShebang, []byte("echo ran-by-sh\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if r := lockCmd(t, nil, "--mount", d.mountpoint, "job", "--", noShebang); r.code != 3 || !strings.Contains(r.stdout, "ran-by-sh") {
		t.Errorf("lock of a script without #!: %s\nwant exit 3 and its output", r)
	}
	// A command killed by a signal: 128 + N, as a shell reports it.
	if r := lockCmd(t, nil, "--mount", d.mountpoint, "job", "--", "bash", "-c", "kill -9 $$"); r.code != 128+9 {
		t.Errorf("lock of a command killed by SIGKILL exit = %d, want 137", r.code)
	}
}

// -n and -w give up on a held name with 1 (or -E); a waiting lock is
// granted once the holder ends.
func TestLockConflictAndWait(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	holder := lockHolder(t, d, "busy")
	// The conflict names the holder as ls does: uid, pid, host, since.
	host, _ := os.Hostname()
	wantHolder := fmt.Sprintf("busy is held by uid %d pid %d on %s since ", os.Getuid(), holder.pid, host)
	if r := lockCmd(t, nil, "-n", "--mount", d.mountpoint, "busy", "--", "true"); r.code != 1 || !strings.Contains(r.stderr, wantHolder) {
		t.Errorf("lock -n on a held name: %s\nwant stderr with %q", r, wantHolder)
	}
	// As flock(1) takes it: everything after NAME is the command, "--" or not.
	if r := lockCmd(t, nil, "-n", "--mount", d.mountpoint, "free", "echo", "-n", "ran"); r.code != 0 || r.stdout != "ran" {
		t.Errorf("lock NAME CMD without --: %s", r)
	}
	if r := lockCmd(t, nil, "-n", "-E", "75", "--mount", d.mountpoint, "busy", "--", "true"); r.code != 75 {
		t.Errorf("lock -n -E 75 exit = %d, want 75", r.code)
	}
	if r := lockCmd(t, nil, "-w", "200ms", "--mount", d.mountpoint, "busy", "--", "true"); r.code != 1 || !strings.Contains(r.stderr, "still held after 200ms by uid") {
		t.Errorf("lock -w 200ms on a held name: %s", r)
	}
	waiter := startProc(t, nil, leasefsBin, "lock", "-w", "20s", "--mount", d.mountpoint, "busy", "--", "bash", "-c", `echo "granted $LEASEFS_GENERATION"`)
	waitWaiters(t, filepath.Join(d.mountpoint, "busy"), 1)
	holder.killGroup()
	if r := waiter.wait(20 * time.Second); r.code != 0 || !strings.Contains(r.stdout, "granted ") {
		t.Fatalf("waiting lock after the holder ended: %s", r)
	}
}

// A lock granted after a wait stays held for as long as the command runs,
// however often lock's garbage collector runs (GOGC=1 makes it run at
// every periodic check): the descriptor that holds the lease is lock's own
// and nothing but lock's exit closes it.
func TestLockAfterWaitHeldThroughGC(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "gc")
	holder := lockHolder(t, d, "gc")
	waiter := startProc(t, []string{"GOGC=1", "P=" + p}, leasefsBin, "lock", "-w", "20s", "--mount", d.mountpoint, "gc", "--",
		"bash", "-c", `echo "granted $LEASEFS_LEASE_ID"; sleep 2; cat "$P"`)
	waitWaiters(t, p, 1)
	holder.killGroup()
	r := waiter.wait(20 * time.Second)
	id := regexp.MustCompile(`(?m)^granted (lease-\S+)$`).FindStringSubmatch(r.stdout)
	if r.code != 0 || id == nil {
		t.Fatalf("waiting lock after the holder ended: %s", r)
	}
	if !strings.Contains(r.stdout, `lease_id = "`+id[1]+`"`) || !strings.Contains(r.stdout, `mode = "handle"`) {
		t.Errorf("two seconds into the command, %s was not its lease %s held as a handle lease: %s", p, id[1], r)
	}
}

// When the daemon stops while the command runs and is not back within
// --reconnect-timeout, the command gets SIGTERM and lock exits 4; the mount
// comes from the daemon serving the default state directory when neither
// --mount nor $LEASEFS_MOUNT says.
func TestLockLostLease(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	env := []string{"LEASEFS_STATE=" + d.state, "LEASEFS_MOUNT="}
	p := startProc(t, env, leasefsBin, "lock", "--grace", "5s", "--reconnect-timeout", "1s", "long", "--",
		"bash", "-c", `trap 'echo got-term; exit 0' TERM; echo running; while :; do sleep 0.05; done`)
	p.expect(`(?m)^running$`, holdTimeout)
	d.stop(true)
	r := p.wait(20 * time.Second)
	if r.code != 4 || !strings.Contains(r.stdout, "got-term") || !strings.Contains(r.stderr, "lost") {
		t.Fatalf("lock whose daemon stopped: exit %d, want 4 after the command got SIGTERM: %s", r.code, r)
	}
}

// Processes the command leaves behind become lock's children (so that a
// lost lease can stop them); lock reaps those that exit, so a long command
// that keeps starting background processes leaves no zombies behind.
func TestLockReapsTheCommandsOrphans(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	r := lockCmd(t, nil, "--mount", d.mountpoint, "orphans", "--", "bash", "-c",
		`for i in $(seq 20); do (sleep 0.01 &); done; sleep 1.5; echo "zombies $(ps -o stat= --ppid $PPID | grep -c Z)"`)
	if r.code != 0 || !strings.Contains(r.stdout, "zombies 0") {
		t.Fatalf("lock of a command that orphans 20 short processes: %s\nwant none left as zombies of lock", r)
	}
}

// When the lease is lost, what the command started stops with it: a child
// that the command left behind when SIGTERM ended it, and one that ignores
// SIGTERM (killed once --grace has passed).
func TestLockLostLeaseStopsTheCommandsChildren(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := startProc(t, nil, leasefsBin, "lock", "--grace", "1s", "--mount", d.mountpoint, "tree", "--", "bash", "-c",
		`sleep 300 & echo "child $!"; (trap '' TERM; exec sleep 301) & echo "child $!"; echo running; wait`)
	p.expect(`(?m)^running$`, holdTimeout)
	var pids []int
	for _, m := range regexp.MustCompile(`(?m)^child (\d+)$`).FindAllStringSubmatch(p.stdout.String(), -1) {
		pid, _ := strconv.Atoi(m[1])
		pids = append(pids, pid)
	}
	if len(pids) != 2 {
		t.Fatalf("want two children of the command: %s", p)
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	mustSh(t, `rm -f "$P"`, "P="+filepath.Join(d.mountpoint, "tree")) // root ends the lease
	if r := p.wait(20 * time.Second); r.code != 4 {
		t.Fatalf("lock whose lease root removed: exit %d, want 4: %s", r.code, r)
	}
	for _, pid := range pids {
		eventually(t, 5*time.Second, fmt.Sprintf("child %d of the command is gone", pid), func() (bool, string) {
			st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			return err != nil || strings.Contains(string(st), ") Z "), string(st)
		})
	}
}

// A wait that the daemon's stop ends exits 69 (EX_UNAVAILABLE): the lock
// was not taken, and not because of a conflict.
func TestLockWaitEndedByDaemonStop(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	lockHolder(t, d, "gone")
	waiter := startProc(t, nil, leasefsBin, "lock", "-w", "30s", "-E", "75", "--mount", d.mountpoint, "gone", "--", "echo", "RAN")
	waitWaiters(t, filepath.Join(d.mountpoint, "gone"), 1)
	d.stop(true)
	if r := waiter.wait(20 * time.Second); r.code != 69 || strings.Contains(r.stdout, "RAN") {
		t.Fatalf("waiting lock whose daemon stopped: %s\nwant exit 69 and the command not run", r)
	}
}

// A command that keeps forking processes that ignore SIGTERM while its
// lease is lost leaves none behind: lock kills until nothing is left below
// it.
func TestLockLostLeaseKillsWhatForksMeanwhile(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	const marker = "3017.25"
	t.Cleanup(func() { killWithArg(marker) })
	p := startProc(t, nil, leasefsBin, "lock", "--grace", "500ms", "--mount", d.mountpoint, "forks", "--", "bash", "-c",
		`trap "" TERM; echo running; while :; do (trap "" TERM; exec sleep `+marker+`) & sleep 0.002; done`)
	p.expect(`(?m)^running$`, holdTimeout)
	mustSh(t, `rm -f "$P"`, "P="+filepath.Join(d.mountpoint, "forks")) // root ends the lease
	if r := p.wait(30 * time.Second); r.code != 4 {
		t.Fatalf("lock whose lease root removed: exit %d, want 4: %s", r.code, r)
	}
	eventually(t, 5*time.Second, "no process of the command is left", func() (bool, string) {
		left := procsWithArg(marker)
		return len(left) == 0, fmt.Sprint(left)
	})
}

// A command that ends just as its lease is lost: lock exits 4 (its work was
// not covered to the end) and stops what the command left running. Root's
// rm ends the lease with the mount still in place, and the command ends as
// soon as the name stops showing its lease, most often before lock's next
// periodic check, so that lock finds the loss only as the command ends.
// (A daemon's stop is no such trigger: a lazily detached mount hides the
// name while the handle still reads its live lease.)
func TestLockLeaseLostAsTheCommandEnds(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	const marker = "3018.25"
	t.Cleanup(func() { killWithArg(marker) })
	n := filepath.Join(d.mountpoint, "ends")
	p := startProc(t, []string{"N=" + n}, leasefsBin, "lock", "--grace", "1s", "--mount", d.mountpoint, "ends", "--", "bash", "-c",
		`(sleep `+marker+` &); echo running; while grep -q "$LEASEFS_LEASE_ID" "$N" 2>/dev/null; do sleep 0.002; done; exit 0`)
	p.expect(`(?m)^running$`, holdTimeout)
	if err := os.Remove(n); err != nil {
		t.Fatalf("rm of the lock's lease: %v", err)
	}
	if r := p.wait(20 * time.Second); r.code != 4 || !strings.Contains(r.stderr, "lost") {
		t.Fatalf("lock whose lease was ended as its command ended: %s\nwant exit 4", r)
	}
	eventually(t, 5*time.Second, "the command's background process is gone", func() (bool, string) {
		left := procsWithArg(marker)
		return len(left) == 0, fmt.Sprint(left)
	})
}

// procsWithArg returns the live processes with arg among their arguments.
func procsWithArg(arg string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !slices.Contains(strings.Split(string(cmdline), "\x00"), arg) {
			continue
		}
		if st, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && !strings.Contains(string(st), ") Z ") {
			out = append(out, pid)
		}
	}
	return out
}

// killWithArg kills the processes procsWithArg finds, after a test.
func killWithArg(arg string) {
	for _, pid := range procsWithArg(arg) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// Signals sent to lock reach the command.
func TestLockForwardsSignals(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := startProc(t, nil, leasefsBin, "lock", "--mount", d.mountpoint, "sig", "--",
		"bash", "-c", `trap 'echo got-usr1; exit 3' USR1; echo running; while :; do sleep 0.05; done`)
	p.expect(`(?m)^running$`, holdTimeout)
	p.signal(syscall.SIGUSR1)
	if r := p.wait(20 * time.Second); r.code != 3 || !strings.Contains(r.stdout, "got-usr1") {
		t.Fatalf("lock after SIGUSR1: %s", r)
	}
}

// `leasefs status` reports the serving daemon and what the store holds, and
// exits 1 once no daemon serves it.
func TestStatusCommand(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	d := startDaemon(t, daemonOpts{})
	reserve(t, filepath.Join(d.mountpoint, "tok"))
	holder := startProc(t, nil, "flock", filepath.Join(d.mountpoint, "h"), "-c", "echo held; exec sleep 60")
	holder.expect(`(?m)^held$`, holdTimeout)
	waiter := startProc(t, nil, "flock", filepath.Join(d.mountpoint, "h"), "true")
	waitWaiters(t, filepath.Join(d.mountpoint, "h"), 1)

	r := runClient(t, nil, leasefsBin, "status", "--state", d.state, "--json")
	if r.code != 0 {
		t.Fatalf("status of a served store: %s", r)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, r.stdout)
	}
	leases, _ := st["leases"].(map[string]any)
	if st["served"] != true || fmt.Sprint(st["pid"]) != strconv.Itoa(d.pid) || st["mountpoint"] != d.mountpoint ||
		fmt.Sprint(leases["token"]) != "1" || fmt.Sprint(leases["handle"]) != "1" || fmt.Sprint(st["waiters"]) != "1" ||
		st["oldest_heartbeat"] == nil || st["since"] == nil {
		t.Errorf("status = %s", r.stdout)
	}
	if r := runClient(t, nil, leasefsBin, "status", "--state", d.state); r.code != 0 || !strings.Contains(r.stdout, "served:      yes") {
		t.Errorf("status table: %s", r)
	}
	holder.killGroup()
	waiter.wait(20 * time.Second)
	d.stop(true)
	r = runClient(t, nil, leasefsBin, "status", "--state", d.state, "--json")
	if r.code != 1 || !strings.Contains(r.stdout, `"served": false`) {
		t.Errorf("status without a daemon: %s", r)
	}
}

// A short -w on a free name takes the lease (the open's own reservation is
// locked at once); it never leaves a reservation behind. -w 0 does not wait.
func TestLockShortWaitLeavesNothing(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	if r := lockCmd(t, nil, "-w", "1ms", "--mount", d.mountpoint, "fresh", "--", "true"); r.code != 0 {
		t.Fatalf("lock -w 1ms on a free name: %s", r)
	}
	if _, err := os.Stat(filepath.Join(d.mountpoint, "fresh")); !os.IsNotExist(err) {
		t.Errorf("after lock -w 1ms the name is still held: %v", err)
	}
	lockHolder(t, d, "busy")
	if r := lockCmd(t, nil, "-w", "0", "--mount", d.mountpoint, "busy", "--", "true"); r.code != 1 {
		t.Errorf("lock -w 0 on a held name: %s", r)
	}
	if l := liveLeases(t, d.state, "busy"); len(l) != 1 || l[0]["mode"] != "handle" {
		t.Errorf("after a refused -w 0 the leases on busy are %v, want only the holder's", l)
	}
}

// SIGKILL of lock ends the lease and the command with it: nobody runs in
// the critical section without the lease.
func TestLockKilledTakesCommandAlong(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := startProc(t, nil, leasefsBin, "lock", "--mount", d.mountpoint, "kil", "--",
		"bash", "-c", `echo "running $$"; exec sleep 60`)
	cmdPID := p.expect(`(?m)^running (\d+)$`, holdTimeout)[1]
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	p.wait(10 * time.Second)
	eventually(t, 10*time.Second, "the command of the killed lock to die", func() (bool, string) {
		st, err := os.ReadFile("/proc/" + cmdPID + "/stat")
		return err != nil || strings.Contains(string(st), ") Z "), string(st)
	})
	if r := lockCmd(t, nil, "-w", "10s", "--mount", d.mountpoint, "kil", "--", "true"); r.code != 0 {
		t.Fatalf("lock after the holder's lock was killed: %s", r)
	}
}

// A signal to a waiting lock ends the wait (128 + N) and leaves nothing
// queued; NAME must stay inside a leasefs mount; bad flag values are usage
// errors.
func TestLockRefusesAndInterrupts(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "n")
	lockHolder(t, d, "n")
	// SIGINT and SIGTERM also end the command's context: several rounds,
	// since which of the two a wait sees first is up to the scheduler.
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGQUIT,
		syscall.SIGTERM, syscall.SIGINT, syscall.SIGTERM, syscall.SIGINT, syscall.SIGTERM, syscall.SIGINT} {
		w := startProc(t, nil, leasefsBin, "lock", "--mount", d.mountpoint, "n", "--", "echo", "RAN")
		waitWaiters(t, p, 1)
		w.signal(sig)
		if r := w.wait(10 * time.Second); r.code != 128+int(sig) || strings.Contains(r.stdout, "RAN") {
			t.Errorf("waiting lock after %v: %s", sig, r)
		}
		waitWaiters(t, p, 0)
	}
	outside := t.TempDir()
	for _, args := range [][]string{
		{"--mount", d.mountpoint, "../escape", "--", "true"},
		{"--mount", d.mountpoint, "", "--", "true"},
		{"-w", "-5s", "--mount", d.mountpoint, "x", "--", "true"},
		{"-E", "300", "--mount", d.mountpoint, "x", "--", "true"},
		{"-n", "-w", "1s", "--mount", d.mountpoint, "x", "--", "true"},
		{"--mount", d.mountpoint, "x"},
	} {
		if r := lockCmd(t, nil, args...); r.code != 2 {
			t.Errorf("lock %q: exit %d, want usage 2: %s", args, r.code, r)
		}
	}
	// A NAME that cannot be opened exits 66 (flock(1)'s EX_NOINPUT), not 1,
	// which -n and -w give a conflict.
	if r := lockCmd(t, nil, "--mount", outside, "foo", "--", "true"); r.code != 66 || !strings.Contains(r.stderr, "not a leasefs mount") {
		t.Errorf("lock in a directory that is no leasefs mount: %s", r)
	}
	if err := os.Mkdir(filepath.Join(d.mountpoint, "ns"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"nons/job": "namespace nons does not exist: mkdir " + filepath.Join(d.mountpoint, "nons"),
		"ns":       "cannot open",
	} {
		if r := lockCmd(t, nil, "-n", "-E", "75", "--mount", d.mountpoint, name, "--", "true"); r.code != 66 || !strings.Contains(r.stderr, want) {
			t.Errorf("lock of %s (a missing namespace, a namespace): %s\nwant exit 66 and %q", name, r, want)
		}
	}
	noDaemon := []string{"LEASEFS_MOUNT=", "LEASEFS_STATE=" + t.TempDir()}
	if r := lockCmd(t, noDaemon, "job", "--", "true"); r.code != 66 || !strings.Contains(r.stderr, "cannot find the leasefs mount") {
		t.Errorf("lock with no mount given and none served: %s\nwant exit 66", r)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 || fileExists(filepath.Join(filepath.Dir(d.mountpoint), "escape")) {
		t.Errorf("lock created files outside the mount: %v", entries)
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
