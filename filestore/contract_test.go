package filestore_test

import (
	"testing"

	"github.com/leasefs/leasefs/filestore"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/leasecore/storetest"
)

func TestFileStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, opts leasecore.Options) leasecore.Store {
		s, err := filestore.Open(t.TempDir(), filestore.Options{Options: opts})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}
