package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// This file runs the client processes of the reliability suite: a fleet of
// real bash, python3, flock(1) and Go processes looping over a few lease
// names (testdata/reliability, testdata/goclient), and a chaos loop that
// SIGKILLs some and SIGSTOPs others past the lease duration.

// slotSpec is one kind of client process in the fleet.
type slotSpec struct {
	kind  string // python, go or bash
	modes string // comma separated, as the client's MODES
}

// reliabilityMix is the fleet: 24 processes mixing token and handle leases.
var reliabilityMix = func() []slotSpec {
	var s []slotSpec
	add := func(n int, kind, modes string) {
		for range n {
			s = append(s, slotSpec{kind, modes})
		}
	}
	add(3, "python", "token")
	add(5, "python", "token,flock,flockw,lockf")
	add(6, "go", "token,flock,ofd")
	add(3, "bash", "token")
	add(2, "bash", "flockfd,token")
	add(3, "bash", "flock1,flock1w")
	add(2, "bash", "token,flockfd,flock1,flock1w")
	return s
}()

// fleetConfig configures [startFleet].
type fleetConfig struct {
	dir      string // the lease directory inside the mount
	names    []string
	lease    time.Duration
	logDir   string
	goclient string // built testdata/goclient
	python   string
	slots    []slotSpec
}

// clientProc is one running client process.
type clientProc struct {
	info   *clientInfo
	slot   int
	cmd    *exec.Cmd
	exited chan struct{}
}

// fleet is the set of client processes of a run. Its methods are safe for
// concurrent use.
type fleet struct {
	t   testing.TB
	cfg fleetConfig

	mu      sync.Mutex
	clients map[int]*clientInfo
	slots   []*clientProc
	stalled map[int]bool // slot → SIGSTOPped now
	nextID  int
	kills   int
	stalls  int
	errs    []string
	start   int64
	stopped bool
}

// buildGoClient builds testdata/goclient into a temporary directory.
func buildGoClient(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "goclient")
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/goclient")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build testdata/goclient: %v\n%s", err, out)
	}
	return bin
}

// startFleet starts one client process per slot. Cleanup kills every process
// group it started, stopped or not.
func startFleet(t testing.TB, cfg fleetConfig) *fleet {
	t.Helper()
	f := &fleet{t: t, cfg: cfg, clients: map[int]*clientInfo{}, stalled: map[int]bool{}, slots: make([]*clientProc, len(cfg.slots))}
	t.Cleanup(func() { f.stop() })
	f.start = monoNow()
	for i := range cfg.slots {
		if err := f.spawn(i); err != nil {
			t.Fatalf("start client: %v", err)
		}
	}
	return f
}

// spawn starts a new client process in slot i.
func (f *fleet) spawn(i int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return nil
	}
	spec := f.cfg.slots[i]
	id := f.nextID
	f.nextID++
	info := &clientInfo{id: id, kind: spec.kind, modes: spec.modes, log: filepath.Join(f.cfg.logDir, fmt.Sprintf("c%03d-%s.log", id, spec.kind))}
	var argv []string
	switch spec.kind {
	case "python":
		argv = []string{f.cfg.python, "-u", "testdata/reliability/client.py"}
	case "go":
		argv = []string{f.cfg.goclient, "run"}
	case "bash":
		argv = []string{"bash", "testdata/reliability/client.sh"}
	default:
		return fmt.Errorf("unknown client kind %q", spec.kind)
	}
	out, err := os.Create(strings.TrimSuffix(info.log, ".log") + ".out")
	if err != nil {
		return err
	}
	defer out.Close()
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = wd
	cmd.Env = append(os.Environ(),
		"M="+f.cfg.dir,
		"NAMES="+strings.Join(f.cfg.names, " "),
		fmt.Sprintf("LEASE_MS=%d", f.cfg.lease.Milliseconds()),
		"LOG="+info.log,
		"MODES="+spec.modes,
		fmt.Sprintf("SEED=%d", rand.Uint64()),
		"GOCLIENT="+f.cfg.goclient,
	)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %q: %w", argv, err)
	}
	p := &clientProc{info: info, slot: i, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	f.clients[id] = info
	f.slots[i] = p
	return nil
}

// kill SIGKILLs the process group of the client in slot i, records when,
// waits for it and starts a replacement unless replace is false.
func (f *fleet) kill(i int, replace bool) {
	f.mu.Lock()
	p := f.slots[i]
	if p == nil {
		f.mu.Unlock()
		return
	}
	f.slots[i] = nil
	delete(f.stalled, i)
	now := monoNow()
	p.info.killed = now
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	f.mu.Unlock()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		f.fail("client %d (pid %d) survived SIGKILL for 10s", p.info.id, p.cmd.Process.Pid)
	}
	// Children outside the group leader's wait (flock(1), cat) die with the
	// group; the leader's exit is what matters for the log.
	if replace {
		if err := f.spawn(i); err != nil {
			f.fail("restart client in slot %d: %v", i, err)
		}
	}
}

// stall SIGSTOPs the process group of the client in slot i for d, then
// SIGCONTs it (unless it was killed meanwhile). It returns at once; wg is
// done once the client has been continued.
func (f *fleet) stall(i int, d time.Duration, wg *sync.WaitGroup) {
	f.mu.Lock()
	p := f.slots[i]
	if p == nil || f.stalled[i] {
		f.mu.Unlock()
		return
	}
	f.stalled[i] = true
	f.stalls++
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGSTOP)
	f.mu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(d)
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.slots[i] == p { // not killed meanwhile: its pid is still its own
			delete(f.stalled, i)
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT)
		}
	}()
}

// chaos kills and stalls random clients until ctx ends: every 250–650 ms it
// SIGKILLs one (and starts a replacement) with probability pKill, or
// SIGSTOPs one for the lease duration plus 0.2–1.2 s with probability pStall
// (at most maxStalled at a time). It returns once every stalled client has
// been continued.
func (f *fleet) chaos(ctx context.Context, pKill, pStall float64, maxStalled int) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(250+rand.IntN(400)) * time.Millisecond):
		}
		i := rand.IntN(len(f.cfg.slots))
		switch x := rand.Float64(); {
		case x < pKill:
			f.mu.Lock()
			f.kills++
			f.mu.Unlock()
			f.kill(i, true)
		case x < pKill+pStall:
			f.mu.Lock()
			n := len(f.stalled)
			f.mu.Unlock()
			if n < maxStalled {
				f.stall(f.pickHolder(i), f.cfg.lease+time.Duration(200+rand.IntN(1000))*time.Millisecond, &wg)
			}
		}
	}
}

// pickHolder returns a slot whose client holds a token lease right now, as
// far as the tail of its log tells (a few random tries), or fallback: a stall
// is worth most to a token holder, whose late renew must then be refused.
func (f *fleet) pickHolder(fallback int) int {
	for range 6 {
		i := rand.IntN(len(f.cfg.slots))
		f.mu.Lock()
		p := f.slots[i]
		f.mu.Unlock()
		if p != nil && holdsToken(p.info.log) {
			return i
		}
	}
	return fallback
}

// holdsToken reports whether the last lines of a client log show a token
// lease acquired or renewed and not yet released.
func holdsToken(log string) bool {
	fh, err := os.Open(log)
	if err != nil {
		return false
	}
	defer fh.Close()
	buf := make([]byte, 1024)
	st, err := fh.Stat()
	if err != nil {
		return false
	}
	off := max(st.Size()-int64(len(buf)), 0)
	n, _ := fh.ReadAt(buf, off)
	lines := strings.Split(strings.TrimSuffix(string(buf[:n]), "\n"), "\n")
	if len(lines) < 2 {
		return false
	}
	last, prev := strings.Fields(lines[len(lines)-1]), strings.Fields(lines[len(lines)-2])
	isTokenOp := func(b []string) bool {
		return len(b) == 9 && b[0] == "B" && b[4] == "token" && (b[2] == "acq" || b[2] == "renew")
	}
	switch {
	case len(last) == 9 && last[0] == "B":
		return last[4] == "token" && last[2] == "renew"
	case len(last) == 7 && last[0] == "E":
		return last[2] == "ok" && isTokenOp(prev)
	}
	return false
}

// stop SIGKILLs every client (continuing stalled ones is not needed: SIGKILL
// ends stopped processes too) and records the end of the run. It is
// idempotent.
func (f *fleet) stop() {
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return
	}
	f.stopped = true // no more replacements
	n := len(f.slots)
	f.mu.Unlock()
	for i := range n {
		f.kill(i, false)
	}
}

// fail records an error found outside the test goroutine.
func (f *fleet) fail(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}

// history returns what the fleet did, for the checker; call it after stop.
func (f *fleet) history(lease time.Duration, crashes []int64) *opHistory {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := &opHistory{lease: lease, start: f.start, clients: map[int]*clientInfo{}, crashes: crashes, crashRun: len(crashes) > 0}
	for id, c := range f.clients {
		h.clients[id] = c
		h.end = max(h.end, c.killed)
	}
	return h
}

// clientOutput returns what the clients printed (errors of the scripts
// themselves), for failure messages; empty when they printed nothing.
func (f *fleet) clientOutput() string {
	var b strings.Builder
	outs, _ := filepath.Glob(filepath.Join(f.cfg.logDir, "*.out"))
	for _, p := range outs {
		data, err := os.ReadFile(p)
		if err != nil || len(data) == 0 {
			continue
		}
		fmt.Fprintf(&b, "== %s\n%s\n", filepath.Base(p), data)
	}
	return b.String()
}
