package leasecore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/leasefs/leasefs/internal/testenv"
	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// fullLease has every field of the table set.
func fullLease() Lease {
	return Lease{
		ID: "lease-x", Resource: "a/b", Status: StatusActive, Mode: ModeToken, Generation: 17,
		HolderUID: 1000, HolderGID: 100, HolderPID: 4242, Host: "vm",
		StartedAt: testStart, HeartbeatAt: testStart, ExpiresAt: testStart.Add(time.Minute),
		CompletedAt: testStart.Add(time.Second), PID: 77, PIDStartTicks: 9, BootID: "boot",
		ActorSessionID: "as", TaskAssignmentID: "ta", AnchorState: "st", AnchorRoot: "ro", Path: "/p", Client: "cl",
		TakeoverRequestedBy: "uid 2", TakeoverRequestedAt: testStart.Add(2 * time.Second), TakeoverReason: "why",
		Waiters: 3,
	}
}

// jsonKeys returns the keys of a JSON object in the order they appear.
func jsonKeys(t *testing.T, data []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not a JSON object: %s", data)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// The JSON of a lease has exactly the keys of its status document, in the
// same order, for a full lease and a minimal one.
func TestLeaseJSONKeysAreStatusDocumentKeys(t *testing.T) {
	t.Parallel()
	minimal := Lease{ID: "lease-y", Resource: "h", Status: StatusActive, Mode: ModeHandle, Generation: 2,
		StartedAt: testStart, HeartbeatAt: testStart}
	for _, l := range []Lease{fullLease(), minimal} {
		data, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := jsonKeys(t, data), docKeys(t, StatusDocument(l)); !slices.Equal(got, want) {
			t.Errorf("JSON keys =\n%v\nstatus document keys =\n%v", got, want)
		}
	}
	var m map[string]any
	data, _ := json.Marshal(fullLease())
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if m["waiters"] != 3.0 || m["generation"] != 17.0 || m["anchor_state"] != "st" ||
		m["started_at"] != testStart.Format(time.RFC3339Nano) || m["boot_id"] != "boot" {
		t.Errorf("JSON values = %v", m)
	}
}

// Every status document key is an xattr and a JSON key; records carry the
// same fields under the reference store's names, minus the derived ones.
func TestRecordKeysFollowTheFieldTable(t *testing.T) {
	t.Parallel()
	l := fullLease()
	m := make(map[string]any)
	if _, err := toml.Decode(string(encodeRecord(&l, "h")), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"thread", "lease_id", "holder_gid", "pid_start_ticks", "token_hash", "anchor_state",
		"takeover_reason", "completed_at"} {
		if _, ok := m[k]; !ok {
			t.Errorf("record lacks %s:\n%s", k, encodeRecord(&l, "h"))
		}
	}
	for _, k := range []string{"resource", "expires_at", "waiters"} {
		if _, ok := m[k]; ok {
			t.Errorf("record has %s, which is not recorded", k)
		}
	}
}

// An optional field that is unset is omitted from the record, never
// written as 0 or "": the reference store reads pid = 0 as a recorded pid.
func TestRecordOmitsUnsetOptionalFields(t *testing.T) {
	t.Parallel()
	s, _, state := newTestStore(t, Options{})
	g := reserve(t, s, "x")
	flushRecords(t, s)
	rec := readRecordMap(t, recordPath(state, g.Lease.ID))
	for _, k := range []string{"pid", "pid_start_ticks", "completed_at", "actor_session_id", "task_assignment_id",
		"anchor_state", "anchor_root", "path", "client", "takeover_requested_by", "takeover_requested_at",
		"takeover_reason", "waiters", "expires_at"} {
		if v, ok := rec[k]; ok {
			t.Errorf("record of a lease without %s writes %s = %#v", k, k, v)
		}
	}
	if _, err := s.Renew(context.Background(), g.Lease.ID, g.Token, Annotations{"pid": "0", "client": ""}); err != nil {
		t.Fatal(err)
	}
	flushRecords(t, s)
	rec = readRecordMap(t, recordPath(state, g.Lease.ID))
	for _, k := range []string{"pid", "pid_start_ticks", "client"} {
		if v, ok := rec[k]; ok {
			t.Errorf("record after clearing %s writes %s = %#v", k, k, v)
		}
	}
}

// Annotations sent with a release are recorded, then the lease ends.
func TestReleaseAppliesAnnotations(t *testing.T) {
	t.Parallel()
	for _, status := range []Status{StatusComplete, StatusAbandoned} {
		t.Run(string(status), func(t *testing.T) {
			t.Parallel()
			s, _, state := newTestStore(t, Options{})
			ctx := context.Background()
			g := reserve(t, s, "x")
			l, err := s.Release(ctx, g.Lease.ID, g.Token, status, Annotations{"anchor_state": "deadbeef", "client": "ci"})
			if err != nil {
				t.Fatal(err)
			}
			if l.Status != status || l.AnchorState != "deadbeef" || l.Client != "ci" {
				t.Fatalf("released lease = %+v", l)
			}
			hist, err := s.History(ctx, "x")
			if err != nil || len(hist) != 1 || hist[0].AnchorState != "deadbeef" {
				t.Fatalf("History = %+v, %v", hist, err)
			}
			flushRecords(t, s)
			if rec := readRecordMap(t, recordPath(state, g.Lease.ID)); rec["anchor_state"] != "deadbeef" || rec["status"] != string(status) {
				t.Errorf("record = %v", rec)
			}
		})
	}
}

// A release whose annotations are invalid changes nothing.
func TestReleaseWithBadAnnotationsChangesNothing(t *testing.T) {
	t.Parallel()
	s, _, _ := newTestStore(t, Options{})
	ctx := context.Background()
	g := reserve(t, s, "x")
	_, err := s.Release(ctx, g.Lease.ID, g.Token, StatusComplete, Annotations{"anchor_state": "a\x00b"})
	wantErr(t, "Release with a NUL annotation", err, ErrInvalidArgument)
	if l, err := s.Live(ctx, "x"); err != nil || l.AnchorState != "" {
		t.Fatalf("lease after a refused release = %+v, %v", l, err)
	}
}

// Waiter counts show on the live lease and reach read-only stores (ls)
// while a daemon serves the directory, and only then.
func TestWaitersArePublished(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()
	reserve(t, s, "x")
	wctx, cancel := context.WithCancel(ctx)
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := s.Acquire(wctx, Draft{Resource: "x", Mode: ModeHandle})
			errs <- err
		}()
	}
	testenv.WaitFor(t, "two waiters", func() bool {
		l, err := s.Live(ctx, "x")
		return err == nil && l.Waiters == 2
	})
	// The daemon's writer publishes the counts soon after they change.
	testenv.WaitFor(t, "two waiters in a read-only store", func() bool {
		ro, err := OpenFileStore(state, Options{Clock: clock, ReadOnly: true, Logger: quietLogger})
		if err != nil {
			t.Fatal(err)
		}
		defer ro.Close()
		l, err := ro.Live(ctx, "x")
		return err == nil && l.Waiters == 2
	})
	noDaemon := openStore(t, state, Options{Clock: clock, ReadOnly: true, NoDaemon: true})
	if l, err := noDaemon.Live(ctx, "x"); err != nil || l.Waiters != 0 {
		t.Errorf("read-only Live without a daemon = %+v, %v; want no waiters", l, err)
	}
	cancel()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled Acquire = %v, want context.Canceled", err)
		}
	}
	testenv.WaitFor(t, "the waiters file removed after the last waiter left", func() bool {
		_, err := os.Stat(filepath.Join(state, waitersName))
		return os.IsNotExist(err)
	})
}

// A read-only store without a lease duration of its own judges expiry with
// the duration the directory was last served with.
func TestReadOnlyStoreAdoptsServedLeaseDuration(t *testing.T) {
	t.Parallel()
	clock := clocktest.NewFakeClock(testStart)
	state := t.TempDir()
	s := openStore(t, state, Options{Clock: clock, LeaseDuration: 30 * time.Minute})
	g := reserve(t, s, "x")
	clock.Advance(10 * time.Minute) // past the default 5 minutes, within 30
	ro := openStore(t, state, Options{Clock: clock, ReadOnly: true})
	if ro.LeaseDuration() != 30*time.Minute {
		t.Errorf("read-only LeaseDuration = %v, want the served 30m", ro.LeaseDuration())
	}
	l, err := ro.Live(context.Background(), "x")
	if err != nil || !l.ExpiresAt.Equal(g.Lease.HeartbeatAt.Add(30*time.Minute)) {
		t.Errorf("read-only Live = %+v, %v; want live, expiring 30m after its heartbeat", l, err)
	}
}
