package integration

import (
	"math"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// pySuccessor is a python3 client that opens $P (held by another), reports out("waiting"),
// blocks in flock(LOCK_EX) and reports out("got") as soon as it returns, then waits for stdin
// to close.
const pySuccessor = `
import fcntl
fd = os.open(os.environ["P"], os.O_CREAT | os.O_RDWR, 0o644)
out("waiting", os.getpid())
fcntl.flock(fd, fcntl.LOCK_EX)
out("got", os.getpid())
sys.stdin.read()
`

// pyBenchHolder is [pyFlockHolder] without O_EXCL: it waits (blocking flock) if the previous
// iteration's successor has not been released yet.
const pyBenchHolder = `
import fcntl
fd = os.open(os.environ["P"], os.O_CREAT | os.O_RDWR, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
out("held", os.getpid())
sys.stdin.read()
`

// BenchmarkKillToGrant measures how long a blocked flock waiter waits for the name after its
// holder is SIGKILLed (docs/PROTOCOL.md §6: "its successor can take it at once"): per iteration a python3
// holder flocks m/k, a python3 successor blocks in flock on it (checked through the status
// document's waiters count), and the clock runs from just before the SIGKILL until the
// successor's "got" line arrives on its stdout pipe. It reports the median and the 99th
// percentile (nearest rank) in milliseconds; run it with -benchtime 100x.
func BenchmarkKillToGrant(b *testing.B) {
	d := startDaemon(b, daemonOpts{})
	p := filepath.Join(d.mountpoint, "k")
	lat := make([]time.Duration, 0, b.N)
	b.StopTimer()
	for range b.N {
		holder := startPy(b, pyBenchHolder, "P="+p)
		holder.expectKey("held", holdTimeout)
		succ := startPy(b, pySuccessor, "P="+p)
		succ.expectKey("waiting", holdTimeout)
		waitWaiters(b, p, 1)

		b.StartTimer()
		start := time.Now()
		holder.signal(syscall.SIGKILL)
		succ.expectKey("got", holdTimeout)
		lat = append(lat, time.Since(start))
		b.StopTimer()

		holder.wait(10 * time.Second)
		_ = succ.stdin.Close() // the successor exits, releasing the name for the next holder
		succ.wait(10 * time.Second)
	}
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	ms := func(q float64) float64 {
		i := max(int(math.Ceil(q*float64(len(lat))))-1, 0)
		return float64(lat[i]) / float64(time.Millisecond)
	}
	b.ReportMetric(ms(0.50), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
	b.ReportMetric(ms(1), "max-ms")
	b.Logf("kill to grant over %d tries: min %v p50 %.2fms p99 %.2fms max %v",
		len(lat), lat[0], ms(0.5), ms(0.99), lat[len(lat)-1])
}
