package leasecore

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// testStart is the time of the leases these tests build; testToken the
// token of the records they encode.
var testStart = time.Date(2026, 11, 30, 2, 0, 0, 123456789, time.UTC)

const testToken = "hwl_testtokentesttokentesttokentesttokentes"

// everyFieldLease returns a lease with every recorded field set.
func everyFieldLease() Lease {
	t := time.Date(2026, 11, 30, 2, 3, 0, 123456789, time.UTC)
	return Lease{
		Resource: "ci/déploy", ID: NewLeaseID(), Status: StatusComplete, Mode: ModeHandle,
		Generation: 1<<48 - 1, HolderUID: 1<<32 - 1, HolderGID: 100, HolderPID: 1<<31 - 1, Host: "vm",
		StartedAt: t, HeartbeatAt: t.Add(time.Second), CompletedAt: t.Add(time.Minute),
		PID: 4242, PIDStartTicks: 912345, BootID: "0f5c-boot",
		ActorSessionID: "a", TaskAssignmentID: "t", AnchorState: "s", AnchorRoot: "/r", Path: "p/q",
		Client: "deploy-bot ✓", TakeoverRequestedBy: "uid 1000 pid 1", TakeoverRequestedAt: t.Add(2 * time.Second),
		TakeoverReason: "please",
	}
}

// sameDecoding checks that the fast path, when it accepts data, agrees
// with the general decoder on the lease, the hash and the error.
func sameDecoding(t *testing.T, data []byte) (accepted bool) {
	t.Helper()
	var fast Lease
	fastHash, ok := decodeCanonical(&fast, data, func(b []byte) string { return string(b) })
	if !ok {
		return false
	}
	fastErr := validateRecord(&fast)
	slow, slowHash, slowErr := decodeTOMLRecord(data)
	switch {
	case (fastErr == nil) != (slowErr == nil) || fastErr != nil && fastErr.Error() != slowErr.Error():
		t.Fatalf("fast path error %v, general decoder %v, on\n%s", fastErr, slowErr, data)
	case fastErr == nil && (!reflect.DeepEqual(fast, slow) || fastHash != slowHash):
		t.Fatalf("fast path decoded\n %+v %q\ngeneral decoder\n %+v %q\nfrom\n%s", fast, fastHash, slow, slowHash, data)
	}
	return true
}

// TestCanonicalRecordsTakeFastPath checks that every record leasefs writes
// takes the fast path and decodes as the general decoder decodes it.
func TestCanonicalRecordsTakeFastPath(t *testing.T) {
	full := everyFieldLease()
	minimal := Lease{ID: NewLeaseID(), Resource: "a", Status: StatusActive, Mode: ModeToken,
		StartedAt: testStart, HeartbeatAt: testStart}
	zeroTime := minimal
	zeroTime.HeartbeatAt = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for name, l := range map[string]Lease{"full": full, "minimal": minimal, "whole seconds": zeroTime} {
		data := EncodeRecord(&l, HashToken(testToken))
		if !sameDecoding(t, data) {
			t.Errorf("%s: the fast path declined a record leasefs wrote:\n%s", name, data)
		}
		got, hash, err := DecodeRecord(data)
		if err != nil || !reflect.DeepEqual(got, l) || hash != HashToken(testToken) {
			t.Errorf("%s: DecodeRecord = %+v, %q, %v; want %+v", name, got, hash, err, l)
		}
	}
}

// TestNonCanonicalRecordsFallBack checks that what the fast path declines
// still loads through the general decoder: reference-store records, native
// datetimes, unknown keys, comments, escapes.
func TestNonCanonicalRecordsFallBack(t *testing.T) {
	id := NewLeaseID()
	base := `lease_id = "` + id + `"
thread = "a"
token_hash = "00"
status = "active"
`
	cases := map[string]string{
		"reference store":  referenceRecord(id, "a", "2026-11-30T02:00:00.123456789Z", "2026-11-30T02:00:00Z"),
		"native datetimes": base + "heartbeat_at = 2026-11-30T02:00:00Z\nstarted_at = 2026-11-30T02:00:00Z\n",
		"unknown key":      base + "heartbeat_at = \"2026-11-30T02:00:00Z\"\nstarted_at = \"2026-11-30T02:00:00Z\"\nfuture = [1, 2]\n",
		"comment":          "# hand-edited\n" + base + "heartbeat_at = \"2026-11-30T02:00:00Z\"\nstarted_at = \"2026-11-30T02:00:00Z\"\n",
		"escape":           strings.Replace(base, `"a"`, `"\u0061"`, 1) + "heartbeat_at = \"2026-11-30T02:00:00Z\"\nstarted_at = \"2026-11-30T02:00:00Z\"\n",
		"no final newline": base + "heartbeat_at = \"2026-11-30T02:00:00Z\"\nstarted_at = \"2026-11-30T02:00:00Z\"",
		"spacing":          strings.Replace(base, "status = ", "status   =  ", 1) + "heartbeat_at = \"2026-11-30T02:00:00Z\"\nstarted_at = \"2026-11-30T02:00:00Z\"\n",
	}
	for name, data := range cases {
		if _, ok := decodeCanonical(new(Lease), []byte(data), nil); ok {
			t.Errorf("%s: the fast path accepted a non-canonical record:\n%s", name, data)
		}
		l, _, err := DecodeRecord([]byte(data))
		if err != nil || l.ID != id || l.Resource != "a" || l.Mode != ModeToken {
			t.Errorf("%s: DecodeRecord = %+v, %v; want the lease loaded", name, l, err)
		}
	}
}

// TestCanonicalDeclinesWhatTOMLRefuses checks inputs the fast path must not
// accept, because the general decoder refuses or reads them differently.
func TestCanonicalDeclinesWhatTOMLRefuses(t *testing.T) {
	for _, data := range []string{
		"lease_id = \"lease-a\"\nlease_id = \"lease-b\"\n", // duplicate key
		"generation = 007\n", // leading zero
		"generation = -1\n",
		"generation = 1_000\n",
		"generation = 9999999999999999999\n",
		"thread = \"a\tb\"\n",
		"thread = \"a\x7fb\"\n",
		"thread = \"\xff\"\n",
		"thread = \"a\"b\"\n",
		"thread = 1\n",
		"generation = \"1\"\n",
		"heartbeat_at = 5\n",
		"token_hash = 5\n",
		"thread = \"a\"\r\n",
		" thread = \"a\"\n",
		"thread = \"\n",
		"\n",
		"",
	} {
		if sameDecoding(t, []byte(data)) {
			t.Errorf("the fast path accepted %q", data)
		}
	}
}

// FuzzDecodeCanonical checks on any input that the fast path never panics
// and, whenever it accepts, agrees with the general decoder (lease, hash,
// error).
func FuzzDecodeCanonical(f *testing.F) {
	full := everyFieldLease()
	f.Add(EncodeRecord(&full, HashToken(testToken)))
	minimal := Lease{ID: "lease-abc", Resource: "a", Status: StatusActive, StartedAt: testStart, HeartbeatAt: testStart}
	f.Add(EncodeRecord(&minimal, "00"))
	f.Add([]byte("lease_id = \"lease-a\"\ngeneration = 281474976710657\n"))
	f.Add([]byte("pid = 4194305\nholder_uid = 4294967296\n"))
	f.Add([]byte("thread = \"é\"\nstatus = \"weird\"\n"))
	f.Add([]byte("heartbeat_at = \"2026-13-30T02:00:00Z\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		sameDecoding(t, data)
		_, _, _ = DecodeRecord(data)
	})
}

// referenceRecord is a record as the reference store writes it: RFC 3339
// string times with nanoseconds, no generation, mode or holder fields.
func referenceRecord(id, thread, heartbeat, started string) string {
	return fmt.Sprintf(`lease_id = %q
thread = %q
actor_session_id = "agent-one"
anchor_state = "hd-state"
anchor_root = "root"
token_hash = %q
heartbeat_at = %s
started_at = %s
status = "active"
`, id, thread, HashToken(testToken), heartbeat, started)
}
