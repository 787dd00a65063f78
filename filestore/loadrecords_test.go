package filestore

import (
	"context"
	"fmt"
	"github.com/leasefs/leasefs/leasecore"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// TestLoadManyRecords loads more records than one loading goroutine claims
// at a time, a mix of canonical records, records only the general decoder
// reads, corrupt ones and leftovers, and checks that every good record
// loads exactly as written — shared strings included — and nothing else.
func TestLoadManyRecords(t *testing.T) {
	state := t.TempDir()
	const n = 5*loadBatch + 17
	want := make(map[string]leasecore.Lease)
	for i := range n {
		l := leasecore.Lease{
			ID: leasecore.NewLeaseID(), Resource: fmt.Sprintf("r-%d", i), Status: leasecore.StatusActive, Mode: leasecore.ModeToken,
			Generation: uint64(i + 1), HolderUID: uint32(i % 7), Host: fmt.Sprintf("host-%d", i%3),
			Client: fmt.Sprintf("client-%d", i%5), BootID: "other-boot", StartedAt: testStart, HeartbeatAt: testStart,
		}
		switch {
		case i%97 == 0:
			writeRaw(t, state, l.ID+".toml", "lease_id = \"not closed\n")
			continue
		case i%89 == 0:
			// Hand-edited: a comment sends it to the general decoder.
			writeRaw(t, state, l.ID+".toml", "# edited\n"+string(leasecore.EncodeRecord(&l, leasecore.HashToken(testToken))))
		default:
			writeRecordFile(t, state, &rec{Lease: l, hash: leasecore.HashToken(testToken)})
		}
		l.ExpiresAt = l.HeartbeatAt.Add(leasecore.DefaultLeaseDuration)
		want[l.ID] = l
	}
	writeRaw(t, state, ".lease-crashed123", "half a record")
	if err := os.Symlink("/etc/passwd", filepath.Join(state, LeasesDir, leasecore.NewLeaseID()+".toml")); err != nil {
		t.Fatal(err)
	}

	s := openStore(t, state, Options{Options: leasecore.Options{Clock: clocktest.NewFakeClock(testStart), ReadOnly: true}})
	list, err := s.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != len(want) {
		t.Fatalf("loaded %d live leases, want %d", len(list), len(want))
	}
	for _, got := range list {
		if w, ok := want[got.ID]; !ok || !reflect.DeepEqual(got, w) {
			t.Fatalf("loaded\n %+v\nwant\n %+v", got, w)
		}
	}
	if _, err := os.Stat(filepath.Join(state, LeasesDir, ".lease-crashed123")); err != nil {
		t.Errorf("a read-only load removed a leftover: %v", err)
	}
}
