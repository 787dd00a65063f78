package filestore

import (
	"context"
	"errors"
	"fmt"
	"github.com/leasefs/leasefs/leasecore"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// testToken is the token of the records that tests write by hand.
const testToken = "hwl_testtokentesttokentesttokentesttokentes"

// testRecord returns an active token-lease record on resource with a
// heartbeat at testStart, as leasecore writes it.
func testRecord(resource string, generation uint64) *rec {
	return &rec{Lease: leasecore.Lease{
		ID:          leasecore.NewLeaseID(),
		Resource:    resource,
		BootID:      procfs.BootID(),
		HeartbeatAt: testStart,
		StartedAt:   testStart,
		Status:      leasecore.StatusActive,
		Generation:  generation,
		Mode:        leasecore.ModeToken,
		HolderUID:   1000,
		HolderGID:   100,
	}, hash: leasecore.HashToken(testToken)}
}

// rec is a record as tests write it: a lease and its token hash.
type rec struct {
	leasecore.Lease
	hash string
}

// writeRecordFile encodes r into the leases directory of state.
func writeRecordFile(t *testing.T, state string, r *rec) string {
	t.Helper()
	return writeRaw(t, state, r.ID+".toml", string(leasecore.EncodeRecord(&r.Lease, r.hash)))
}

// writeRaw writes content to name in the leases directory of state.
func writeRaw(t *testing.T, state, name, content string) string {
	t.Helper()
	dir := filepath.Join(state, LeasesDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// readRecordMap parses the record at path as generic TOML.
func readRecordMap(t *testing.T, path string) map[string]any {
	t.Helper()
	m := make(map[string]any)
	if _, err := toml.DecodeFile(path, &m); err != nil {
		t.Fatalf("record %s does not parse as TOML: %v", path, err)
	}
	return m
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
`, id, thread, leasecore.HashToken(testToken), heartbeat, started)
}

func TestReferenceRecordLoads(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                 string
		heartbeat, started   string
		wantHeartbeatAt      time.Time
		wantStartedAtWallSec int64
	}{
		{"string times", `"2026-11-30T01:59:00.123456789Z"`, `"2026-11-30T01:58:00.987654321Z"`,
			time.Date(2026, 11, 30, 1, 59, 0, 123456789, time.UTC), testStart.Add(-2 * time.Minute).Unix()},
		{"string times with offset", `"2026-11-30T03:59:00.123456789+02:00"`, `"2026-11-30T01:58:00Z"`,
			time.Date(2026, 11, 30, 1, 59, 0, 123456789, time.UTC), testStart.Add(-2 * time.Minute).Unix()},
		{"native datetimes", `2026-11-30T01:59:00.123456789Z`, `2026-11-30T01:58:00.5Z`,
			time.Date(2026, 11, 30, 1, 59, 0, 123456789, time.UTC), testStart.Add(-2 * time.Minute).Unix()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			state := t.TempDir()
			clock := clocktest.NewFakeClock(testStart)
			ctx := context.Background()
			existing := testRecord("other", 7)
			writeRecordFile(t, state, existing)
			id := leasecore.NewLeaseID()
			path := writeRaw(t, state, id+".toml", referenceRecord(id, "feature/a", tc.heartbeat, tc.started))

			s := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
			l, err := s.Live(ctx, "feature/a")
			if err != nil {
				t.Fatalf("reference record is not live: %v", err)
			}
			if l.ID != id || l.Mode != leasecore.ModeToken || l.ActorSessionID != "agent-one" || l.AnchorState != "hd-state" ||
				l.AnchorRoot != "root" || !l.HeartbeatAt.Equal(tc.wantHeartbeatAt) || l.StartedAt.Unix() != tc.wantStartedAtWallSec {
				t.Errorf("loaded lease = %+v", l)
			}
			if l.Generation != 8 {
				t.Errorf("generation = %d, want 8 (after an existing 7)", l.Generation)
			}
			rec := readRecordMap(t, path)
			if rec["generation"] != int64(8) || rec["token_hash"] != leasecore.HashToken(testToken) || rec["thread"] != "feature/a" {
				t.Errorf("generation not persisted or record damaged: %v", rec)
			}
			// Unset fields stay out of the rewritten record: the
			// reference store would read holder_pid = 0 as a value.
			for _, key := range []string{"holder_pid", "host", "pid", "client"} {
				if v, ok := rec[key]; ok {
					t.Errorf("rewritten record has %s = %v; unset fields are omitted", key, v)
				}
			}
			// The reference token renews the lease.
			clock.Advance(time.Minute)
			if _, err := s.Renew(ctx, id, testToken, leasecore.Annotations{}); err != nil {
				t.Fatalf("Renew with the reference token: %v", err)
			}
			clock.Advance(leasecore.DefaultLeaseDuration)
			_, err = s.Live(ctx, "feature/a")
			wantErr(t, "Live after the lease duration", err, leasecore.ErrNotFound)
		})
	}
}

func TestReferenceRecordWithOldHeartbeatIsDead(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	id := leasecore.NewLeaseID()
	writeRaw(t, state, id+".toml", referenceRecord(id, "feature-a",
		`"2026-11-30T01:54:00.123456789Z"`, `"2026-11-30T01:50:00Z"`)) // 6 minutes old
	clock := clocktest.NewFakeClock(testStart)
	s := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
	_, err := s.Live(context.Background(), "feature-a")
	wantErr(t, "Live of an expired reference record", err, leasecore.ErrNotFound)
	l, err := s.Load(context.Background(), id)
	if err != nil || l.Status != leasecore.StatusAbandoned || !l.CompletedAt.Equal(testStart) {
		t.Fatalf("expired reference lease = %+v, %v", l, err)
	}
}

// A record written by leasecore must load in the reference store: every
// reference field present with the reference type (docs/PROTOCOL.md §4.3).
func TestRecordHasReferenceFields(t *testing.T) {
	t.Parallel()
	s, clock, state := newTestStore(t, Options{})
	ctx := context.Background()
	pid := os.Getpid()
	if _, err := s.Mkdir(ctx, "feature", 0, 0); err != nil {
		t.Fatal(err)
	}
	g, err := s.Reserve(ctx, leasecore.Draft{Resource: "feature/x", HolderUID: 1000, Annotations: leasecore.Annotations{
		"actor_session_id": "agent-one", "task_assignment_id": "task-7", "anchor_state": "hd-state",
		"anchor_root": "root", "path": "/src/x", "client": "test", "pid": strconv.Itoa(pid),
	}})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(1500 * time.Millisecond)
	if _, err := s.End(ctx, g.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	flushRecords(t, s)
	rec := readRecordMap(t, recordPath(state, g.Lease.ID))
	wantStrings := map[string]string{
		"lease_id": g.Lease.ID, "thread": "feature/x", "actor_session_id": "agent-one",
		"task_assignment_id": "task-7", "anchor_state": "hd-state", "anchor_root": "root",
		"path": "/src/x", "token_hash": leasecore.HashToken(g.Token), "boot_id": procfs.BootID(), "status": "complete",
	}
	for k, want := range wantStrings {
		if got, ok := rec[k].(string); !ok || got != want {
			t.Errorf("%s = %#v, want string %q", k, rec[k], want)
		}
	}
	if got, ok := rec["pid"].(int64); !ok || got != int64(pid) || got < 0 || got > 1<<32-1 {
		t.Errorf("pid = %#v, want integer %d (u32 in the reference)", rec["pid"], pid)
	}
	for k, want := range map[string]time.Time{
		"heartbeat_at": testStart, "started_at": testStart, "completed_at": testStart.Add(1500 * time.Millisecond),
	} {
		str, ok := rec[k].(string)
		if !ok {
			t.Errorf("%s = %#v (%T), want an RFC 3339 string", k, rec[k], rec[k])
			continue
		}
		got, err := time.Parse(time.RFC3339Nano, str)
		if err != nil || !got.Equal(want) || !strings.HasSuffix(str, "Z") {
			t.Errorf("%s = %q (%v), want %v in UTC", k, str, err, want)
		}
	}
	if rec["generation"] != int64(g.Lease.Generation) || rec["mode"] != "token" {
		t.Errorf("generation %#v mode %#v", rec["generation"], rec["mode"])
	}
}

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	l := leasecore.Lease{
		ID: leasecore.NewLeaseID(), Resource: "a/b", Status: leasecore.StatusComplete, Mode: leasecore.ModeHandle, Generation: 42,
		HolderUID: 1 << 31, HolderGID: 7, HolderPID: 99, Host: "h",
		StartedAt: testStart, HeartbeatAt: testStart.Add(time.Second), CompletedAt: testStart.Add(time.Minute),
		PID: 1234, PIDStartTicks: 987654, BootID: "boot",
		ActorSessionID: "a\"q", TaskAssignmentID: "t\\b", AnchorState: "s\nn", AnchorRoot: "r\tt", Path: "/p",
		Client: "c\x01", TakeoverRequestedBy: "uid 1", TakeoverRequestedAt: testStart.Add(2 * time.Second),
		TakeoverReason: "why",
	}
	data := leasecore.EncodeRecord(&l, "hash")
	got, hash, err := leasecore.DecodeRecord(data)
	if err != nil {
		t.Fatalf("DecodeRecord of an encoded record: %v\n%s", err, data)
	}
	if hash != "hash" {
		t.Errorf("token hash = %q", hash)
	}
	if !reflect.DeepEqual(got, l) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, l)
	}
}

func TestCorruptRecordsAreSkipped(t *testing.T) {
	t.Parallel()
	valid := func(mut func(*rec)) func(string) string {
		return func(id string) string {
			r := testRecord("bad", 1)
			r.ID = id
			mut(r)
			return string(leasecore.EncodeRecord(&r.Lease, r.hash))
		}
	}
	tests := []struct {
		name    string
		content func(id string) string
	}{
		{"garbage", func(string) string { return "not toml {{{ \x00\xff" }},
		{"empty", func(string) string { return "" }},
		{"truncated", func(id string) string { s := valid(func(*rec) {})(id); return s[:len(s)/2] }},
		{"lease_id differs from file name", valid(func(r *rec) { r.ID = leasecore.NewLeaseID() })},
		{"invalid lease_id", valid(func(r *rec) { r.ID = "lease-../../x" })},
		{"status weird", valid(func(r *rec) { r.Status = "weird" })},
		{"mode weird", valid(func(r *rec) { r.Mode = "weird" })},
		{"negative pid", valid(func(r *rec) { r.PID = -1 })},
		{"huge pid", valid(func(r *rec) { r.PID = 1 << 40 })},
		{"negative holder_uid", func(id string) string {
			return strings.Replace(valid(func(*rec) {})(id), "holder_uid = 1000", "holder_uid = -5", 1)
		}},
		{"holder_uid over 32 bits", func(id string) string {
			return strings.Replace(valid(func(*rec) {})(id), "holder_uid = 1000", "holder_uid = 4294967296", 1)
		}},
		{"thread with dotdot", valid(func(r *rec) { r.Resource = "../etc" })},
		{"empty thread", valid(func(r *rec) { r.Resource = "" })},
		{"missing heartbeat", valid(func(r *rec) { r.HeartbeatAt = time.Time{} })},
		{"time of the wrong type", func(id string) string {
			return strings.Replace(valid(func(*rec) {})(id), "heartbeat_at = \"", "heartbeat_at = 12\nx = \"", 1)
		}},
		{"bad time string", func(id string) string {
			return strings.Replace(valid(func(*rec) {})(id), "heartbeat_at = \"2026", "heartbeat_at = \"yesterday", 1)
		}},
		{"over 1 MiB", func(id string) string {
			return valid(func(*rec) {})(id) + "# " + strings.Repeat("x", leasecore.MaxRecordBytes) + "\n"
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			state := t.TempDir()
			good := testRecord("good", 2)
			writeRecordFile(t, state, good)
			badID := leasecore.NewLeaseID()
			writeRaw(t, state, badID+".toml", tc.content(badID))
			s := openStore(t, state, Options{Options: leasecore.Options{Clock: clocktest.NewFakeClock(testStart)}})
			ctx := context.Background()
			list, err := s.List(ctx)
			if err != nil || len(list) != 1 || list[0].ID != good.ID {
				t.Fatalf("List = %+v, %v; want only the good record", list, err)
			}
			if _, err := s.Load(ctx, badID); !errors.Is(err, leasecore.ErrNotFound) {
				t.Errorf("Load of the corrupt record = %v, want ErrNotFound", err)
			}
			reserve(t, s, "bad") // a corrupt record holds nothing
		})
	}
}

// A hostile entry in the leases directory must not hang Open: a
// FIFO named like a record blocks open(2) for reading until a writer comes.
func TestFIFORecordDoesNotHangOpen(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	good := testRecord("good", 1)
	writeRecordFile(t, state, good)
	fifo := filepath.Join(state, LeasesDir, leasecore.NewLeaseID()+".toml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	type result struct {
		s   *Store
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := Open(state, Options{Options: leasecore.Options{Clock: clocktest.NewFakeClock(testStart), Logger: quietLogger, Host: "h"}})
		done <- result{s, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(5 * time.Second): // a guard, not a wait for correctness
		// Unblock the reader so the goroutine ends, then fail.
		if f, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			f.Close()
		}
		r = <-done
		if r.s != nil {
			r.s.Close()
		}
		t.Fatal("Open blocked on a FIFO named like a record (opened it for reading without O_NONBLOCK)")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.s.Close()
	if _, err := r.s.Live(context.Background(), "good"); err != nil {
		t.Fatal(err)
	}
}

func TestLeftoverTempFilesRemovedAtOpen(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	good := testRecord("good", 1)
	writeRecordFile(t, state, good)
	writeRaw(t, state, storeLockName, "")
	leftover := writeRaw(t, state, "."+good.ID+".toml123456789", "half a rec")
	other := writeRaw(t, state, ".lease-"+strings.Repeat("b", 39)+".toml42", "")
	clock := clocktest.NewFakeClock(testStart)

	ro := openStore(t, state, Options{Options: leasecore.Options{Clock: clock, ReadOnly: true}})
	ro.Close()
	if _, err := os.Stat(leftover); err != nil {
		t.Fatalf("a read-only open removed a temporary file: %v", err)
	}

	s := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
	for _, p := range []string{leftover, other} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("leftover %s not removed at open: %v", filepath.Base(p), err)
		}
	}
	if _, err := s.Live(context.Background(), "good"); err != nil {
		t.Fatalf("the record beside the leftover: %v", err)
	}
}

// Annotations are stored in TOML, which must be valid UTF-8: one that is not
// must be refused, or the lease must survive a restart anyway. Accepting it
// and writing a record that can no longer be parsed loses the lease.
func TestInvalidUTF8AnnotationDoesNotLoseLease(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		do   func(s *Store, ctx context.Context) (leasecore.Lease, error)
	}{
		{"reserve annotation", func(s *Store, ctx context.Context) (leasecore.Lease, error) {
			g, err := s.Reserve(ctx, leasecore.Draft{Resource: "x", Annotations: leasecore.Annotations{"actor_session_id": "agent\xff"}})
			return g.Lease, err
		}},
		{"renew annotation", func(s *Store, ctx context.Context) (leasecore.Lease, error) {
			g := reserve(t, s, "x")
			return s.Renew(ctx, g.Lease.ID, g.Token, leasecore.Annotations{"client": "c\xc3"})
		}},
		{"takeover reason", func(s *Store, ctx context.Context) (leasecore.Lease, error) {
			g := reserve(t, s, "x")
			return s.RequestTakeover(ctx, g.Lease.ID, leasecore.TakeoverRequest{By: "uid 2", Reason: "r\xfe"})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, clock, state := newTestStore(t, Options{})
			ctx := context.Background()
			l, err := tc.do(s, ctx)
			if errors.Is(err, leasecore.ErrInvalidArgument) {
				return // refused: fine
			}
			if err != nil {
				t.Fatalf("error = %v, want nil or ErrInvalidArgument", err)
			}
			s.Close()
			s2 := openStore(t, state, Options{Options: leasecore.Options{Clock: clock}})
			if _, err := s2.Live(ctx, "x"); err != nil {
				t.Fatalf("lease %s accepted with invalid UTF-8 is lost after a restart: %v", l.ID, err)
			}
		})
	}
}
