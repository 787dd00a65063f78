package leasecore_test

import (
	"testing"

	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/leasecore/storetest"
)

func TestFileStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, opts leasecore.Options) leasecore.Store {
		s, err := leasecore.OpenFileStore(t.TempDir(), opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestMemStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, opts leasecore.Options) leasecore.Store {
		s := leasecore.NewMemStore(opts)
		t.Cleanup(func() { s.Close() })
		return s
	})
}
