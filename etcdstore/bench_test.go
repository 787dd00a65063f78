package etcdstore_test

import (
	"context"
	"github.com/leasefs/leasefs/filestore"
	"log/slog"
	"strconv"
	"testing"

	"github.com/leasefs/leasefs/etcdstore"
	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/leasecore"
)

// BenchmarkOps measures the store operations of the etcd store against an
// embedded single-member etcd (in this process, on loopback: each round
// trip includes the server's WAL fsync), beside the file store in a
// temporary directory, in one run so that the two compare under the same
// load.
func BenchmarkOps(b *testing.B) {
	srv := etcdtest.Start(b)
	quiet := slog.New(slog.DiscardHandler)
	stores := map[string]func(b *testing.B) leasecore.Store{
		"file": func(b *testing.B) leasecore.Store {
			s, err := filestore.Open(b.TempDir(), filestore.Options{Options: leasecore.Options{Logger: quiet}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		},
		"etcd": func(b *testing.B) leasecore.Store {
			return open(b, srv, etcdstore.Options{Options: leasecore.Options{Logger: quiet}})
		},
	}
	for _, kind := range []string{"file", "etcd"} {
		b.Run("ReserveEnd/"+kind, func(b *testing.B) {
			s, ctx, i := stores[kind](b), context.Background(), 0
			for b.Loop() {
				g, err := s.Reserve(ctx, leasecore.Draft{Resource: "r" + strconv.Itoa(i)})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := s.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
		b.Run("Renew/"+kind, func(b *testing.B) {
			s, ctx := stores[kind](b), context.Background()
			g, err := s.Reserve(ctx, leasecore.Draft{Resource: "r"})
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := s.Renew(ctx, g.Lease.ID, g.Token, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("Live/"+kind, func(b *testing.B) {
			s, ctx := stores[kind](b), context.Background()
			if _, err := s.Reserve(ctx, leasecore.Draft{Resource: "r"}); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := s.Live(ctx, "r"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
