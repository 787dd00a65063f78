package filestore

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/leasecore/storetest"
)

func TestStatusDocumentOfAReservedLease(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t, Options{})
	g := reserve(t, s, "feature-a")
	doc := leasecore.StatusDocument(g.Lease)
	keys := storetest.DocKeys(t, doc)
	// boot_id is recorded at reserve (docs/PROTOCOL.md §5 rule 3) and is optional.
	want := slices.Clone(storetest.RequiredStatusKeys)
	if procfs.BootID() != "" {
		want = append(want, "boot_id")
	}
	if !slices.Equal(keys, want) {
		t.Fatalf("keys = %v, want %v", keys, want)
	}
	if strings.Contains(string(doc), g.Token) || strings.Contains(string(doc), leasecore.HashToken(g.Token)) ||
		strings.Contains(string(doc), "token_hash") {
		t.Fatalf("status document reveals the token or its hash:\n%s", doc)
	}
	m := storetest.ParseDoc(t, doc)
	if m["resource"] != "feature-a" || m["lease_id"] != g.Lease.ID || m["status"] != "active" || m["mode"] != "token" ||
		m["generation"] != int64(1) || m["holder_uid"] != int64(1000) || m["holder_pid"] != int64(4242) || m["host"] != "testhost" {
		t.Errorf("document values = %v", m)
	}
	for k, want := range map[string]time.Time{
		"started_at":   testStart.Truncate(time.Millisecond),
		"heartbeat_at": testStart.Truncate(time.Millisecond),
		"expires_at":   testStart.Add(leasecore.DefaultLeaseDuration).Truncate(time.Millisecond),
	} {
		got, ok := m[k].(time.Time)
		if !ok || !got.Equal(want) {
			t.Errorf("%s = %#v, want native datetime %v", k, m[k], want)
		}
	}
	for _, f := range leasecore.StatusFields(g.Lease) {
		if strings.HasSuffix(f.Key, "_at") && (!storetest.StatusTimePattern.MatchString(f.TOML) || f.Raw != f.TOML) {
			t.Errorf("%s rendered %q / raw %q, want millisecond UTC datetime", f.Key, f.TOML, f.Raw)
		}
	}
}

func TestStatusDocumentAfterRelease(t *testing.T) {
	t.Parallel()
	s, clock, _ := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "x")
	clock.Advance(1234 * time.Millisecond)
	l, err := s.Release(ctx, g.Lease.ID, g.Token, leasecore.StatusComplete, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := storetest.ParseDoc(t, leasecore.StatusDocument(l))
	if m["status"] != "complete" {
		t.Errorf("status = %v", m["status"])
	}
	if _, ok := m["expires_at"]; ok {
		t.Error("an ended lease shows expires_at")
	}
	if got, ok := m["completed_at"].(time.Time); !ok || !got.Equal(clock.Now().Truncate(time.Millisecond)) {
		t.Errorf("completed_at = %v, want %v", m["completed_at"], clock.Now().Truncate(time.Millisecond))
	}
}
