package filestore

import (
	"fmt"
	"github.com/leasefs/leasefs/leasecore"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// plantActive writes n active token leases as records into a new state
// directory under b.TempDir and returns it.
func plantActive(b *testing.B, n int) string {
	b.Helper()
	state := b.TempDir()
	dir := filepath.Join(state, LeasesDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	now := time.Now().UTC()
	for i := range n {
		l := leasecore.Lease{
			ID: leasecore.NewLeaseID(), Resource: fmt.Sprintf("r-%06d", i), Status: leasecore.StatusActive, Mode: leasecore.ModeToken,
			Generation: uint64(i + 1), HolderUID: uint32(1000 + i%100), HolderGID: uint32(1000 + i%100),
			HolderPID: 4000 + i, Host: "bench", StartedAt: now, HeartbeatAt: now, Client: "scale-bench",
		}
		if err := os.WriteFile(filepath.Join(dir, l.ID+".toml"), leasecore.EncodeRecord(&l, leasecore.HashToken(leasecore.NewToken())), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	return state
}

// BenchmarkOpenFileStore measures opening a state directory of n live
// leases, writable (as the daemon does) and read-only (as "leasefs ls"
// does), and the heap that stays live per lease. Profile it with
// -cpuprofile and -memprofile.
func BenchmarkOpenFileStore(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		state := plantActive(b, n)
		for _, ro := range []bool{false, true} {
			b.Run(strconv.Itoa(n)+"/readonly="+strconv.FormatBool(ro), func(b *testing.B) {
				var live uint64
				for b.Loop() {
					s, err := Open(state, Options{Options: leasecore.Options{ReadOnly: ro, LeaseDuration: time.Hour, Host: "bench"}})
					if err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					runtime.GC()
					var ms runtime.MemStats
					runtime.ReadMemStats(&ms)
					live = ms.HeapAlloc
					runtime.KeepAlive(s)
					b.StartTimer()
					s.Close()
				}
				b.ReportMetric(float64(live)/float64(n), "live-B/lease")
			})
		}
	}
}

// BenchmarkDecodeRecord measures decoding one canonical record, the
// per-record work of a load besides its system calls.
func BenchmarkDecodeRecord(b *testing.B) {
	now := time.Now().UTC()
	l := leasecore.Lease{
		ID: leasecore.NewLeaseID(), Resource: "team/r-000042", Status: leasecore.StatusActive, Mode: leasecore.ModeToken,
		Generation: 42, HolderUID: 1000, HolderGID: 1000, HolderPID: 4242, Host: "bench",
		StartedAt: now, HeartbeatAt: now, Client: "scale-bench",
	}
	data := leasecore.EncodeRecord(&l, leasecore.HashToken(leasecore.NewToken()))
	intern := interner{}
	for b.Loop() {
		var got leasecore.Lease
		if _, err := leasecore.DecodeRecordInto(&got, data, intern.get); err != nil {
			b.Fatal(err)
		}
	}
}
