package cli

import (
	"context"
	"fmt"
	"github.com/leasefs/leasefs/filestore"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasefs/leasefs/leasecore"
)

// BenchmarkLs measures "leasefs ls" in process on a state directory of
// 100,000 live token leases (records in the format of docs/PROTOCOL.md
// §4.3); profile it with -cpuprofile.
func BenchmarkLs(b *testing.B) {
	const n = 100000
	state := b.TempDir()
	dir := filepath.Join(state, filestore.LeasesDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "lease-duration"), []byte("1h0m0s\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	// Records exactly as the daemon writes them, so that the record cache
	// holds them (a record that differs from its encoding is not cached).
	now := time.Now().UTC().Truncate(time.Second).Add(123456789).Format(time.RFC3339Nano)
	for i := range n {
		id := leasecore.NewLeaseID()
		rec := fmt.Sprintf("thread = \"r-%06d\"\nlease_id = %q\nstatus = \"active\"\nmode = \"token\"\ngeneration = %d\n"+
			"holder_uid = %d\nholder_gid = %d\nholder_pid = %d\nhost = \"h\"\nstarted_at = %q\nheartbeat_at = %q\ntoken_hash = \"%064x\"\n",
			i, id, i+1, 1000+i%100, 1000+i%100, 4000+i, now, now, i)
		if err := os.WriteFile(filepath.Join(dir, id+".toml"), []byte(rec), 0o600); err != nil {
			b.Fatal(err)
		}
	}
	// A daemon that served the directory leaves a record cache, which
	// "leasefs ls" reads as a daemon's next start does.
	s, err := filestore.Open(state, filestore.Options{Options: leasecore.Options{LeaseDuration: time.Hour}})
	if err != nil {
		b.Fatal(err)
	}
	s.Close()
	for b.Loop() {
		if code := Run(context.Background(), []string{"ls", "--state", state}, io.Discard, io.Discard); code != 0 {
			b.Fatalf("leasefs ls exited %d", code)
		}
	}
}
