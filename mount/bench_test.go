package mount

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/leasefs/leasefs/internal/engine"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/testenv"
	"github.com/leasefs/leasefs/leasecore"
)

// benchClientEnv names the environment variable that turns the test binary
// into a benchmark client: "<loop> <path> <iterations>".
const benchClientEnv = "LEASEFS_BENCH_CLIENT"

// BenchmarkCycles measures the daemon's cost per lease cycle and per handle
// lease cycle through a real mount, over the memory store and the file
// store. The clients run in a child process (this test binary, see
// TestBenchClient), so a CPU profile of this process (-cpuprofile) is the
// daemon's alone. Needs root and /dev/fuse; skipped otherwise.
//
//	go test ./mount/ -run '^$' -bench Cycles -benchtime 2000x -cpuprofile cpu.out
func BenchmarkCycles(b *testing.B) {
	testenv.RequireFUSE(b)
	for _, st := range benchStores {
		for _, loop := range []string{"lease", "handle"} {
			b.Run(st.name+"/"+loop, func(b *testing.B) {
				mp := benchMount(b, st.open)
				p := filepath.Join(mp, "bench")
				cmd := exec.Command(os.Args[0], "-test.run=^TestBenchClient$", "-test.count=1")
				cmd.Env = append(os.Environ(), benchClientEnv+"="+loop+" "+p+" "+strconv.Itoa(b.N))
				cpu0 := selfCPU(b)
				b.ResetTimer()
				out, err := cmd.CombinedOutput()
				b.StopTimer()
				if err != nil {
					b.Fatalf("client: %v\n%s", err, out)
				}
				b.ReportMetric(float64((selfCPU(b)-cpu0).Microseconds())/float64(b.N), "daemon-cpu-us/op")
			})
		}
	}
}

// storeOpener returns the [Options.OpenStore] of a benchmark's store; nil
// is the file store in the state directory.
type storeOpener func(state string) func(context.Context, *slog.Logger, StoreHooks) (leasecore.Store, error)

// benchStores are the stores the benchmarks run over: the memory store
// (the daemon's own cost) and the file store (with its disk writes).
var benchStores = []struct {
	name string
	open storeOpener
}{
	{"mem", func(string) func(context.Context, *slog.Logger, StoreHooks) (leasecore.Store, error) {
		return func(context.Context, *slog.Logger, StoreHooks) (leasecore.Store, error) {
			return engine.NewMemStore(leasecore.Options{Logger: slog.New(slog.DiscardHandler)}), nil
		}
	}},
	{"file", func(string) func(context.Context, *slog.Logger, StoreHooks) (leasecore.Store, error) {
		return nil
	}},
}

// benchMount mounts a daemon on a fresh mountpoint, with its log at Info
// level written nowhere (the formatting cost stays), and stops it at the
// end of b.
func benchMount(b *testing.B, open storeOpener) string {
	b.Helper()
	state, mp := b.TempDir(), b.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{
			Mountpoint: mp,
			StateDir:   state,
			OpenStore:  open(state),
			Logger:     slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})),
			OnReady:    func() { close(ready) },
			Debug:      os.Getenv("BENCH_DEBUG") != "",
		})
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		b.Fatalf("mount: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		b.Fatal("mount not ready after 10s")
	}
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			b.Errorf("daemon: %v", err)
		}
	})
	return mp
}

// selfCPU returns the user and system CPU time this process has used: the
// daemon's, not the client's (RUSAGE_SELF excludes children).
func selfCPU(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestBenchClient is the client half of BenchmarkCycles; it does nothing
// unless run by it.
func TestBenchClient(t *testing.T) {
	spec := os.Getenv(benchClientEnv)
	if spec == "" {
		t.Skip("run by BenchmarkCycles")
	}
	var loop, p string
	var n int
	if _, err := fmt.Sscan(spec, &loop, &p, &n); err != nil {
		t.Fatalf("bad %s %q: %v", benchClientEnv, spec, err)
	}
	buf := make([]byte, 4096)
	for i := range n {
		switch loop {
		case "lease":
			fd, err := syscall.Open(p, syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDWR, 0o644)
			if err != nil {
				t.Fatalf("cycle %d: open: %v", i, err)
			}
			if _, err := syscall.Read(fd, buf); err != nil {
				t.Fatalf("cycle %d: read: %v", i, err)
			}
			_ = syscall.Close(fd)
			if err := syscall.Unlink(p); err != nil {
				t.Fatalf("cycle %d: unlink: %v", i, err)
			}
		case "hold":
			// Hold the name by a blocking flock: say "waiting" when it
			// must wait, "held" once granted, then wait for stdin to close.
			fd, err := syscall.Open(p, syscall.O_CREAT|syscall.O_RDWR, 0o644)
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			if err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
				fmt.Println("waiting")
				if err := syscall.Flock(fd, syscall.LOCK_EX); err != nil {
					t.Fatalf("flock: %v", err)
				}
			}
			fmt.Println("held")
			_, _ = io.Copy(io.Discard, os.Stdin)
			return
		case "handle":
			fd, err := syscall.Open(p, syscall.O_CREAT|syscall.O_RDWR, 0o644)
			if err != nil {
				t.Fatalf("cycle %d: open: %v", i, err)
			}
			if err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
				t.Fatalf("cycle %d: flock: %v", i, err)
			}
			if err := syscall.Flock(fd, syscall.LOCK_UN); err != nil {
				t.Fatalf("cycle %d: unlock: %v", i, err)
			}
			_ = syscall.Close(fd)
		default:
			t.Fatalf("unknown loop %q", loop)
		}
	}
}

// BenchmarkKillToGrant measures how long a blocked flock waiter waits after
// the holder is SIGKILLed (docs/PROTOCOL.md §6), over the memory store (the
// kernel's and the daemon's share) and the file store (with its record
// writes). Holder and waiter are child processes (TestBenchClient); the
// clock runs from just before the SIGKILL until the waiter reports the
// grant. It reports the median and the 99th percentile in milliseconds;
// run it with -benchtime 100x.
func BenchmarkKillToGrant(b *testing.B) {
	testenv.RequireFUSE(b)
	python, err := exec.LookPath("python3")
	if err != nil {
		b.Skip("no python3")
	}
	for _, st := range benchStores {
		b.Run(st.name, func(b *testing.B) {
			p := filepath.Join(benchMount(b, st.open), "k")
			lat := make([]time.Duration, 0, b.N)
			for range b.N {
				holder := startHolder(b, python, p)
				holder.expect(b, "held")
				succ := startClient(b, "hold "+p+" 1")
				succ.expect(b, "waiting")
				waitForWaiters(b, p, 1)
				start := time.Now()
				_ = holder.cmd.Process.Kill()
				succ.expect(b, "held")
				lat = append(lat, time.Since(start))
				_ = holder.cmd.Wait()
				_ = succ.stdin.Close()
				_ = succ.cmd.Wait()
			}
			reportLatencies(b, lat)
		})
	}
}

// reportLatencies reports the median, 99th percentile (nearest rank) and
// maximum of lat in milliseconds.
func reportLatencies(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	q := func(f float64) float64 {
		i := max(int(math.Ceil(f*float64(len(lat))))-1, 0)
		return float64(lat[i]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
	b.ReportMetric(0, "ns/op")
}

// pyHolder flocks $P and says "held", then waits for stdin to close. The
// holder that is killed is a small python3 process, as in the integration
// benchmark of the same name: the exit of a Go test binary (its threads
// and address space) takes the kernel several milliseconds more before it
// closes the descriptors.
const pyHolder = `
import fcntl, os, sys
fd = os.open(os.environ["P"], os.O_CREAT | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
`

// startHolder starts pyHolder on p with python; it is killed at the end of b.
func startHolder(b *testing.B, python, p string) *client {
	b.Helper()
	return startCmd(b, exec.Command(python, "-c", pyHolder), "P="+p)
}

// client is a child process of a benchmark that reports by lines.
type client struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
}

// startClient starts TestBenchClient with spec; it is killed at the end
// of b.
func startClient(b *testing.B, spec string) *client {
	b.Helper()
	return startCmd(b, exec.Command(os.Args[0], "-test.run=^TestBenchClient$", "-test.count=1"), benchClientEnv+"="+spec)
}

// startCmd starts cmd with env added; it is killed at the end of b.
func startCmd(b *testing.B, cmd *exec.Cmd, env ...string) *client {
	b.Helper()
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return &client{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(out)}
}

// expect waits for the client's next line and checks it is want.
func (c *client) expect(b *testing.B, want string) {
	b.Helper()
	if !c.lines.Scan() {
		b.Fatalf("client exited before %q: %v", want, c.lines.Err())
	}
	if got := c.lines.Text(); got != want {
		b.Fatalf("client said %q, want %q", got, want)
	}
}

// waitForWaiters waits until the status document of p counts n waiters.
func waitForWaiters(b *testing.B, p string, n int) {
	b.Helper()
	want := []byte("\nwaiters = " + strconv.Itoa(n) + "\n")
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if doc, err := os.ReadFile(p); err == nil && bytes.Contains(doc, want) {
			return
		}
	}
	b.Fatalf("%s never counted %d waiters", p, n)
}
