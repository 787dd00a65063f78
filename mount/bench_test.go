package mount

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

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
	if os.Geteuid() != 0 {
		b.Skip("needs root for a direct mount")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		b.Skip("no /dev/fuse")
	}
	stores := []struct {
		name string
		open func(state string) func(context.Context, *slog.Logger) (leasecore.Store, error)
	}{
		{"mem", func(string) func(context.Context, *slog.Logger) (leasecore.Store, error) {
			return func(context.Context, *slog.Logger) (leasecore.Store, error) {
				return leasecore.NewMemStore(leasecore.Options{Logger: slog.New(slog.DiscardHandler)}), nil
			}
		}},
		{"file", func(string) func(context.Context, *slog.Logger) (leasecore.Store, error) { return nil }},
	}
	for _, st := range stores {
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

// benchMount mounts a daemon on a fresh mountpoint, with its log at Info
// level written nowhere (the formatting cost stays), and stops it at the
// end of b.
func benchMount(b *testing.B, open func(state string) func(context.Context, *slog.Logger) (leasecore.Store, error)) string {
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
