package filestore

import (
	"github.com/leasefs/leasefs/leasecore"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/internal/syncbuf"
)

// A checkpoint of syncfsRecords records or more syncs the filesystem once
// instead of fdatasyncing each record; when that syncfs fails, it syncs
// the records one by one and still succeeds, and says so in the log. A
// checkpoint of fewer records does not call syncfs.
func TestCheckpointSyncsManyRecordsByOneSyncfs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		records    int
		fail       bool
		wantCalls  int32
		wantWarned bool
	}{
		{"many", syncfsRecords + 10, false, 1, false},
		{"many, syncfs fails", syncfsRecords + 10, true, 1, true},
		{"few", syncfsRecords / 2, false, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var log syncbuf.Buffer
			s, _, _ := newTestStore(t, Options{Options: leasecore.Options{Logger: slog.New(slog.NewTextHandler(&log, nil))}})
			var calls atomic.Int32
			s.seam.Lock()
			s.syncFS = func(fd int) error {
				calls.Add(1)
				if tc.fail {
					return unix.EIO
				}
				return unix.Syncfs(fd)
			}
			s.seam.Unlock()
			for i := range tc.records - 1 {
				reserve(t, s, "r"+strconv.Itoa(i))
			}
			// The next change rotates, and the finished epoch holds
			// every record reserved above.
			s.seam.Lock()
			s.checkpointAt = 1
			s.seam.Unlock()
			reserve(t, s, "last")
			s.seam.Lock()
			c := s.ckpt
			s.seam.Unlock()
			if c == nil {
				t.Fatal("no background checkpoint after a rotation")
			}
			<-c.done
			if len(c.ids) != tc.records-1 {
				t.Fatalf("the checkpoint synced %d records, want %d", len(c.ids), tc.records-1)
			}
			if c.err != nil {
				t.Errorf("checkpoint: %v", c.err)
			}
			if got := calls.Load(); got != tc.wantCalls {
				t.Errorf("syncfs called %d times, want %d", got, tc.wantCalls)
			}
			if warned := strings.Contains(log.String(), "syncing the changed records one by one"); warned != tc.wantWarned {
				t.Errorf("fallback logged = %v, want %v; log:\n%s", warned, tc.wantWarned, log.String())
			}
			// The epoch was let go: the next rotation does not redo it.
			s.seam.Lock()
			err := s.settleCheckpoint()
			s.seam.Unlock()
			if err != nil {
				t.Errorf("settleCheckpoint: %v", err)
			}
			if got := calls.Load(); got != tc.wantCalls {
				t.Errorf("after settling, syncfs called %d times, want %d", got, tc.wantCalls)
			}
		})
	}
}

func TestKernelAtLeast(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		release string
		want    bool
	}{
		{"5.8.0", true},
		{"5.8", true},
		{"5.7.19-generic", false},
		{"4.19.0", false},
		{"6.18.44-fc-v1147", true},
		{"5.10rc1", true},
		{"10.0.0", true},
		{"", false},
		{"linux", false},
		{"5.x", false},
	} {
		if got := kernelAtLeast(tc.release, 5, 8); got != tc.want {
			t.Errorf("kernelAtLeast(%q, 5, 8) = %v, want %v", tc.release, got, tc.want)
		}
	}
}
