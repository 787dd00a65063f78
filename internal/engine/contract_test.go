package engine_test

import (
	"testing"

	"github.com/leasefs/leasefs/internal/engine"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/leasecore/storetest"
)

func TestMemStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, opts leasecore.Options) leasecore.Store {
		s := engine.NewMemStore(opts)
		t.Cleanup(func() { s.Close() })
		return s
	})
}
