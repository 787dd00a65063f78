package leasecore_test

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/leasecore/storetest"
)

// testStart is the time of the leases these tests build.
var testStart = time.Date(2026, 11, 30, 2, 0, 0, 123456789, time.UTC)

// fullLease has every field of the table set.
func fullLease() leasecore.Lease {
	return leasecore.Lease{
		ID: "lease-x", Resource: "a/b", Status: leasecore.StatusActive, Mode: leasecore.ModeToken, Generation: 17,
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
	minimal := leasecore.Lease{ID: "lease-y", Resource: "h", Status: leasecore.StatusActive, Mode: leasecore.ModeHandle, Generation: 2,
		StartedAt: testStart, HeartbeatAt: testStart}
	for _, l := range []leasecore.Lease{fullLease(), minimal} {
		data, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := jsonKeys(t, data), storetest.DocKeys(t, leasecore.StatusDocument(l)); !slices.Equal(got, want) {
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
	if _, err := toml.Decode(string(leasecore.EncodeRecord(&l, "h")), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"thread", "lease_id", "holder_gid", "pid_start_ticks", "token_hash", "anchor_state",
		"takeover_reason", "completed_at"} {
		if _, ok := m[k]; !ok {
			t.Errorf("record lacks %s:\n%s", k, leasecore.EncodeRecord(&l, "h"))
		}
	}
	for _, k := range []string{"resource", "expires_at", "waiters"} {
		if _, ok := m[k]; ok {
			t.Errorf("record has %s, which is not recorded", k)
		}
	}
}
