package integration

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// scaleLeaseDuration is the --lease-duration of [BenchmarkScale]: long
// enough that no planted lease expires while it is measured.
const scaleLeaseDuration = time.Hour

// scaleReserves is how many reserves [BenchmarkScale] times for its p50.
const scaleReserves = 500

// BenchmarkScale measures how leasefs copes with many live leases: for each
// size it plants that many active token leases as record files
// (<state>/writer-leases/<id>.toml in the format of docs/PROTOCOL.md §4.3,
// fresh heartbeats, holder uids spread over 100 uids so that no quota is
// reached), starts the daemon and reports
//
//	start-s      from exec to the daemon's "mounted" line
//	start-cpu-s  the daemon's user and system time by then (a figure less
//	             disturbed by other load on the machine than start-s)
//	rss-MiB      the daemon's VmRSS right after start
//	readdir-s    reading every name of the mount's root (the first listing)
//	readdir2-s   the same a second time
//	ls-s         "leasefs ls --state STATE" while the daemon serves it
//	ls-cpu-s     its user and system time
//	reserve-ms   p50 of open(O_CREAT|O_EXCL) of a fresh name (each then unlinked)
//
// It measures once per size whatever b.N is: run it with
//
//	LEASEFS_REQUIRE_FUSE=1 go test -run '^$' -bench Scale -benchtime 1x ./integration/
//
// (without -race: the daemon is built with the race detector when the
// tests are, which multiplies every figure). LEASEFS_SCALE_SIZES overrides
// the sizes, e.g. "100,10000".
func BenchmarkScale(b *testing.B) {
	sizes := []int{100, 100000}
	if env := os.Getenv("LEASEFS_SCALE_SIZES"); env != "" {
		sizes = nil
		for f := range strings.SplitSeq(env, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 0 {
				b.Fatalf("LEASEFS_SCALE_SIZES=%q: %q is not a count", env, f)
			}
			sizes = append(sizes, n)
		}
	}
	for _, n := range sizes {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			for b.Loop() {
			}
			m := measureScale(b, n)
			b.ReportMetric(m.start.Seconds(), "start-s")
			b.ReportMetric(float64(m.rssKiB)/1024, "rss-MiB")
			b.ReportMetric(m.readdir.Seconds(), "readdir-s")
			b.ReportMetric(m.readdir2.Seconds(), "readdir2-s")
			b.ReportMetric(m.ls.Seconds(), "ls-s")
			b.ReportMetric(m.startCPU.Seconds(), "start-cpu-s")
			b.ReportMetric(m.lsCPU.Seconds(), "ls-cpu-s")
			b.ReportMetric(float64(m.reserveP50)/float64(time.Millisecond), "reserve-ms")
			b.Logf("%d leases: start %v (CPU %v), RSS %d KiB, readdir %v (again %v), ls %v (CPU %v), reserve p50 %v",
				n, m.start, m.startCPU, m.rssKiB, m.readdir, m.readdir2, m.ls, m.lsCPU, m.reserveP50)
		})
	}
}

// scaleFigures is what [measureScale] measured.
type scaleFigures struct {
	start, readdir, readdir2, ls, reserveP50 time.Duration
	startCPU, lsCPU                          time.Duration // user + system time
	rssKiB                                   int
}

// measureScale plants n live leases in a fresh state directory, serves it
// and measures; see [BenchmarkScale].
func measureScale(b *testing.B, n int) scaleFigures {
	b.Helper()
	state := filepath.Join(b.TempDir(), "state")
	plantLeases(b, state, n)

	var m scaleFigures
	t0 := time.Now()
	d := startDaemon(b, daemonOpts{state: state, leaseDuration: scaleLeaseDuration, readyTimeout: 2 * time.Minute})
	m.start = time.Since(t0)
	m.rssKiB, m.startCPU = vmRSS(b, d.pid), cpuTime(b, d.pid)

	for _, dst := range []*time.Duration{&m.readdir, &m.readdir2} {
		t0 = time.Now()
		names := readNames(b, d.mountpoint)
		*dst = time.Since(t0)
		if len(names) != n {
			b.Fatalf("readdir of the mount: %d names, want %d", len(names), n)
		}
	}

	t0 = time.Now()
	ls := exec.Command(leasefsBin, "ls", "--state", state)
	var out, errOut bytes.Buffer
	ls.Stdout, ls.Stderr = &out, &errOut
	if err := ls.Run(); err != nil {
		b.Fatalf("leasefs ls: %v\n%s", err, errOut.String())
	}
	m.ls = time.Since(t0)
	m.lsCPU = ls.ProcessState.UserTime() + ls.ProcessState.SystemTime()
	if lines := bytes.Count(out.Bytes(), []byte("\n")); lines != n+1 {
		b.Fatalf("leasefs ls printed %d lines, want %d (header and one per lease)", lines, n+1)
	}

	lat := make([]time.Duration, 0, scaleReserves)
	for i := range scaleReserves {
		p := filepath.Join(d.mountpoint, fmt.Sprintf("fresh-%d", i))
		t0 = time.Now()
		fd, err := syscall.Open(p, syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDWR|syscall.O_CLOEXEC, 0o644)
		lat = append(lat, time.Since(t0))
		if err != nil {
			b.Fatalf("reserve %s: %v", p, err)
		}
		_ = syscall.Close(fd)
		if err := os.Remove(p); err != nil {
			b.Fatalf("release %s: %v", p, err)
		}
	}
	slices.Sort(lat)
	m.reserveP50 = lat[len(lat)/2]
	if code := d.stop(true); code != 0 {
		b.Fatalf("daemon exited %d; stderr:\n%s", code, d.stderr())
	}
	return m
}

// plantLeases writes n active token leases as records into a new state
// directory, as a daemon would have left them: lease ids valid under
// leasecore.ValidateLeaseID, resources "lease-000001"… at the root, heartbeats
// of now.
func plantLeases(b *testing.B, state string, n int) {
	b.Helper()
	dir := filepath.Join(state, "writer-leases")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	host, err := os.Hostname()
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	var rec bytes.Buffer
	random := make([]byte, 20)
	for i := range n {
		_, _ = rand.Read(random)
		id := "lease-" + hex.EncodeToString(random)[:39]
		rec.Reset()
		fmt.Fprintf(&rec, `thread = "r-%06d"
lease_id = %q
status = "active"
mode = "token"
generation = %d
holder_uid = %d
holder_gid = %d
holder_pid = %d
host = %q
started_at = %q
heartbeat_at = %q
client = "scale-bench"
token_hash = "%064x"
`, i, id, i+1, 1000+i%100, 1000+i%100, 4000+i, host, now, now, i)
		if err := os.WriteFile(filepath.Join(dir, id+".toml"), rec.Bytes(), 0o600); err != nil {
			b.Fatal(err)
		}
	}
}

// readNames lists dir with getdents(2) only, as "ls -f" does.
func readNames(b *testing.B, dir string) []string {
	b.Helper()
	f, err := os.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		b.Fatalf("readdir %s: %v", dir, err)
	}
	return names
}

// vmRSS returns the resident set size of process pid in KiB.
func vmRSS(b *testing.B, pid int) int {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				b.Fatalf("VmRSS %q: %v", v, err)
			}
			return kib
		}
	}
	b.Fatal(errors.New("no VmRSS in /proc/pid/status"))
	return 0
}

// cpuTime returns the user and system time process pid has used so far,
// from /proc/PID/stat (proc(5): utime and stime, fields 14 and 15, in
// clock ticks of 1/100 s).
func cpuTime(b *testing.B, pid int) time.Duration {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The command name (field 2) may hold spaces: count from after it.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	utime, err1 := strconv.Atoi(fields[11])
	stime, err2 := strconv.Atoi(fields[12])
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, data)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
