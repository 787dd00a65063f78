package filestore

import (
	"context"
	"github.com/leasefs/leasefs/leasecore"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// commits records the durations reported to Options.OnCommit. Safe for
// concurrent use.
type commits struct {
	mu sync.Mutex
	ds []time.Duration
}

func (c *commits) observe(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ds = append(c.ds, d)
}

func (c *commits) all() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.ds...)
}

// Every durable change of a file store is reported to OnCommit once, with a
// positive duration; a change that failed is not reported.
func TestOnCommitReportsDurableChanges(t *testing.T) {
	t.Parallel()
	var c commits
	s, _, state := newTestStore(t, Options{Options: leasecore.Options{OnCommit: c.observe}})
	ctx := context.Background()
	if n := len(c.all()); n != 0 {
		t.Fatalf("opening an empty store reported %d commits, want 0", n)
	}
	g := reserve(t, s, "x") // a record
	if _, err := s.Renew(ctx, g.Lease.ID, g.Token, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Mkdir(ctx, "ns", 1000, 100); err != nil { // the namespaces file
		t.Fatal(err)
	}
	if _, err := s.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	got := c.all()
	if len(got) != 4 {
		t.Fatalf("reserve, renew, mkdir, end reported %d commits %v, want 4", len(got), got)
	}
	for i, d := range got {
		if d <= 0 {
			t.Errorf("commit %d took %v, want a positive duration", i, d)
		}
	}

	dir := filepath.Join(state, LeasesDir)
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(ctx, leasecore.Draft{Resource: "y", HolderUID: 1000}); err == nil {
		t.Fatal("Reserve with the records directory gone succeeded")
	}
	if n := len(c.all()); n != 4 {
		t.Errorf("a failed reserve was reported: %d commits, want 4", n)
	}
	if err := os.Rename(dir+".moved", dir); err != nil {
		t.Fatal(err)
	}
}
