package etcdstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/leasefs/leasefs/etcdstore"
	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/leasecore/storetest"
)

var prefixes atomic.Int64

// open opens a store under a fresh prefix of srv.
func open(t *testing.T, srv *etcdtest.Server, opts etcdstore.Options) *etcdstore.Store {
	t.Helper()
	s, err := etcdstore.Open(context.Background(), []string{srv.Endpoint()},
		fmt.Sprintf("/test/%d", prefixes.Add(1)), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestContract(t *testing.T) {
	srv := etcdtest.Start(t)
	storetest.Run(t, func(t *testing.T, opts leasecore.Options) leasecore.Store {
		return open(t, srv, etcdstore.Options{Options: opts})
	})
}
