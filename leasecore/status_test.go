package leasecore_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/leasecore/storetest"
)

func TestStatusDocumentOptionalKeys(t *testing.T) {
	t.Parallel()
	full := leasecore.Lease{
		ID: "lease-x", Resource: "a/b", Status: leasecore.StatusComplete, Mode: leasecore.ModeToken, Generation: 17,
		HolderUID: 1000, HolderPID: 4242, Host: "vm",
		StartedAt: testStart, HeartbeatAt: testStart, ExpiresAt: testStart.Add(time.Minute),
		CompletedAt: testStart.Add(time.Second), PID: 77, BootID: "boot",
		ActorSessionID: "as", TaskAssignmentID: "ta", AnchorState: "st", AnchorRoot: "ro", Path: "/p", Client: "cl",
		TakeoverRequestedBy: "uid 2", TakeoverRequestedAt: testStart.Add(2 * time.Second), TakeoverReason: "why", Waiters: 3,
	}
	wantFull := append(slices.Clone(storetest.RequiredStatusKeys), "completed_at", "pid", "boot_id", "actor_session_id",
		"task_assignment_id", "anchor_state", "anchor_root", "path", "client", "takeover_requested_by",
		"takeover_requested_at", "takeover_reason", "waiters")
	if keys := storetest.DocKeys(t, leasecore.StatusDocument(full)); !slices.Equal(keys, wantFull) {
		t.Errorf("full document keys =\n%v\nwant\n%v", keys, wantFull)
	}
	m := storetest.ParseDoc(t, leasecore.StatusDocument(full))
	if m["waiters"] != int64(3) || m["pid"] != int64(77) || m["takeover_reason"] != "why" {
		t.Errorf("optional values = %v", m)
	}

	handle := leasecore.Lease{ID: "lease-y", Resource: "h", Status: leasecore.StatusActive, Mode: leasecore.ModeHandle, Generation: 2,
		StartedAt: testStart, HeartbeatAt: testStart, HolderPID: -1}
	wantHandle := []string{"resource", "lease_id", "status", "mode", "generation", "holder_uid",
		"holder_pid", "host", "started_at", "heartbeat_at"}
	keys := storetest.DocKeys(t, leasecore.StatusDocument(handle))
	if !slices.Equal(keys, wantHandle) {
		t.Errorf("handle document keys = %v, want %v (no expires_at, no unset optional keys)", keys, wantHandle)
	}
	if m := storetest.ParseDoc(t, leasecore.StatusDocument(handle)); m["holder_pid"] != int64(0) {
		t.Errorf("negative holder pid rendered as %v", m["holder_pid"])
	}
}

func TestStatusDocumentHostileStrings(t *testing.T) {
	t.Parallel()
	l := leasecore.Lease{
		ID: "lease-x", Resource: "a \"quoted\" \\ name", Status: leasecore.StatusActive, Mode: leasecore.ModeToken,
		Host: "h\nx = 1", StartedAt: testStart, HeartbeatAt: testStart,
		ActorSessionID: "line1\nline2\r\n\x00\x1b[31m\x7f", Client: "tab\there",
		TakeoverReason: "\"\"\"triple\"\"\" '''lit'''",
	}
	m := storetest.ParseDoc(t, leasecore.StatusDocument(l))
	for k, want := range map[string]string{
		"resource": l.Resource, "host": l.Host, "actor_session_id": l.ActorSessionID,
		"client": l.Client, "takeover_reason": l.TakeoverReason,
	} {
		if m[k] != want {
			t.Errorf("%s = %q, want %q", k, m[k], want)
		}
	}
	if _, injected := m["x"]; injected {
		t.Error("a newline in a value injected a key")
	}
	for _, f := range leasecore.StatusFields(l) {
		if f.Key == "host" && f.Raw != l.Host {
			t.Errorf("raw host = %q, want unquoted %q", f.Raw, l.Host)
		}
	}
}

func TestQuoteTOMLRoundTrip(t *testing.T) {
	t.Parallel()
	var all strings.Builder
	for r := rune(0); r < 0x80; r++ {
		all.WriteRune(r)
	}
	tests := []string{
		"", "plain", `a"b`, `back\slash`, `\u0041 literal escape`, "new\nline", "cr\rlf\r\n",
		"tab\t", "\x00\x01\x08\x0b\x0c\x1f\x7f", "unicode é 日本 🙂", "\u2028\u2029\ufeff", all.String(),
		`"""`, `'''`, "ends with backslash\\",
	}
	for _, in := range tests {
		q := leasecore.QuoteTOML(in)
		if !strings.HasPrefix(q, `"`) || !strings.HasSuffix(q, `"`) || strings.ContainsAny(q[1:len(q)-1], "\n\r\x00\x7f") {
			t.Errorf("QuoteTOML(%q) = %s: not a one-line basic string", in, q)
		}
		var v struct{ K string }
		if _, err := toml.Decode("K = "+q+"\n", &v); err != nil {
			t.Errorf("QuoteTOML(%q) = %s does not parse: %v", in, q, err)
			continue
		}
		if v.K != in {
			t.Errorf("QuoteTOML(%q) round-trips to %q", in, v.K)
		}
	}
	// Invalid UTF-8 cannot be represented; the result must still parse.
	var v struct{ K string }
	if _, err := toml.Decode("K = "+leasecore.QuoteTOML("a\xffb")+"\n", &v); err != nil {
		t.Errorf("leasecore.QuoteTOML of invalid UTF-8 does not parse: %v", err)
	}
}
