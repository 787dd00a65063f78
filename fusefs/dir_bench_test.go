package fusefs

import (
	"context"
	"github.com/leasefs/leasefs/internal/engine"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/leasefs/leasefs/leasecore"
)

// BenchmarkReaddir lists a root of 100,000 live leases through
// dirNode.Readdir, as one READDIR stream does.
func BenchmarkReaddir(b *testing.B) {
	const n = 100000
	store := engine.NewMemStore(leasecore.Options{
		LeaseDuration: time.Hour, MaxLeasesPerUID: n, Host: "bench", Logger: slog.New(slog.DiscardHandler),
	})
	defer store.Close()
	ctx := context.Background()
	for i := range n {
		if _, err := store.Reserve(ctx, leasecore.Draft{Resource: "r-" + strconv.Itoa(i)}); err != nil {
			b.Fatal(err)
		}
	}
	f := New(store, Options{Logger: slog.New(slog.DiscardHandler)})
	_ = f.RawFileSystem()
	for b.Loop() {
		ds, errno := f.root.Readdir(ctx)
		if errno != 0 {
			b.Fatal(errno)
		}
		count := 0
		for ds.HasNext() {
			if _, errno := ds.Next(); errno != 0 {
				b.Fatal(errno)
			}
			count++
		}
		if count != n+2 {
			b.Fatalf("%d entries, want %d", count, n+2)
		}
	}
}
