package etcdstore

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/leasefs/leasefs/leasecore"
)

// A record decodes the same through the fast path (the record's canonical
// lines, then the extra keys by their lines) as through the general TOML
// decoder, whatever the daemon identity holds; a value the fast path
// cannot read still decodes.
func TestDecodeFastPathMatchesTOML(t *testing.T) {
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	for _, daemon := range []string{"/var/lib/leasefs", `/tmp/odd "quoted" dir\with\backslashes`, "/tmp/ünïcode ✓", ""} {
		s := &Store{opts: Options{DaemonID: daemon}}
		l := leasecore.Lease{
			ID: leasecore.NewLeaseID(), Resource: "ns/name", Mode: leasecore.ModeHandle, Status: leasecore.StatusActive,
			HolderUID: 1000, HolderPID: 42, Host: "h", BootID: "b", StartedAt: now, HeartbeatAt: now,
		}
		val := s.encode(l, "hash", chRenewed, 7*time.Second)
		kv := &mvccpb.KeyValue{Value: []byte(val), CreateRevision: 9, ModRevision: 11}
		fast, err := s.decode(kv, true)
		if err != nil {
			t.Fatalf("decode (daemon %q): %v\n%s", daemon, err, val)
		}
		slow := &rec{kv: kv}
		slow.l, slow.hash, err = leasecore.DecodeRecord([]byte(val))
		if err != nil {
			t.Fatal(err)
		}
		slow.l.Generation = 9
		s.decodeExtra(slow)
		if !reflect.DeepEqual(fast, slow) {
			t.Errorf("daemon %q: fast path %+v, TOML %+v", daemon, fast, slow)
		}
		i := strings.Index(val, "\nleasefs_")
		escaped := strings.ContainsAny(daemon, `"\`) // canonical strings hold no escapes
		if i < 0 || new(rec).extraLines([]byte(val[i+1:])) == escaped {
			t.Errorf("daemon %q: the extra keys took the wrong path:\n%s", daemon, val)
		}
		if fast.change != chRenewed || fast.daemon != daemon || fast.duration != 7*time.Second {
			t.Errorf("daemon %q: extras %q %q %v", daemon, fast.change, fast.daemon, fast.duration)
		}
	}
	// A value written by hand, in TOML that is not the canonical form.
	odd := strings.ReplaceAll(new(Store).encode(leasecore.Lease{
		ID: leasecore.NewLeaseID(), Resource: "x", Mode: leasecore.ModeToken, Status: leasecore.StatusActive,
		Host: "h", BootID: "b", StartedAt: now, HeartbeatAt: now,
	}, "", chReserved, 0), `leasefs_change = "`, `leasefs_change  =  "`)
	r, err := new(Store).decode(&mvccpb.KeyValue{Value: []byte(odd)}, false)
	if err != nil || r.change != chReserved {
		t.Errorf("non-canonical value: %v, change %q", err, r.change)
	}
	// The extra keys first, the record after them.
	i := strings.Index(odd, "\nleasefs_")
	swapped := odd[i+1:] + odd[:i+1]
	r, err = new(Store).decode(&mvccpb.KeyValue{Value: []byte(swapped)}, false)
	if err != nil || r.change != chReserved || r.l.Resource != "x" {
		t.Errorf("extra keys before the record: %v, %+v\n%s", err, r, swapped)
	}
}
