package filestore

import (
	"context"
	"fmt"
	"github.com/leasefs/leasefs/leasecore"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// BenchmarkReserveAmong measures Reserve and End of a fresh name in a store
// that already holds n ended records: the cost must not grow with n.
func BenchmarkReserveAmong(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			state := b.TempDir()
			dir := filepath.Join(state, LeasesDir)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				b.Fatal(err)
			}
			for i := range n {
				l := leasecore.Lease{
					ID: leasecore.NewLeaseID(), Resource: fmt.Sprintf("old-%d", i), Status: leasecore.StatusComplete, Mode: leasecore.ModeToken,
					Generation: uint64(i + 1), StartedAt: testStart, HeartbeatAt: testStart,
					CompletedAt: testStart.Add(time.Duration(i) * time.Millisecond),
				}
				data := leasecore.EncodeRecord(&l, leasecore.HashToken(leasecore.NewToken()))
				if err := os.WriteFile(filepath.Join(dir, l.ID+".toml"), data, 0o600); err != nil {
					b.Fatal(err)
				}
			}
			s := openStore(b, state, Options{Options: leasecore.Options{Clock: clocktest.NewFakeClock(testStart)}})
			if hist, err := s.History(context.Background(), ""); err != nil || len(hist) != n {
				b.Fatalf("History = %d records, %v; want %d", len(hist), err, n)
			}
			ctx := context.Background()
			i := 0
			for b.Loop() {
				g, err := s.Reserve(ctx, leasecore.Draft{Resource: "fresh-" + strconv.Itoa(i)})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := s.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkReserveEndClients measures Reserve and End of distinct names by
// 1 and 16 concurrent callers of one file store: with group commit, the
// callers share commits, so 16 get more done than one.
func BenchmarkReserveEndClients(b *testing.B) {
	for _, clients := range []int{1, 16} {
		b.Run(strconv.Itoa(clients), func(b *testing.B) {
			s := openStore(b, b.TempDir(), Options{Options: leasecore.Options{HistoryKeep: 100, Clock: clocktest.NewFakeClock(testStart)}})
			ctx := context.Background()
			var next atomic.Int64
			b.SetParallelism(clients) // per GOMAXPROCS; 16/GOMAXPROCS is close enough
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					g, err := s.Reserve(ctx, leasecore.Draft{Resource: "r-" + strconv.FormatInt(next.Add(1), 10)})
					if err != nil {
						b.Error(err)
						return
					}
					if _, err := s.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
