package leasecore

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// requiredKeys are the status document keys of docs/PROTOCOL.md §4.1 that every token
// lease shows, in order.
var requiredKeys = []string{
	"resource", "lease_id", "status", "mode", "generation", "holder_uid",
	"holder_pid", "host", "started_at", "heartbeat_at", "expires_at",
}

var statusTimePattern = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)

// docKeys returns the keys of a status document in order.
func docKeys(t *testing.T, doc []byte) []string {
	t.Helper()
	var keys []string
	for line := range strings.SplitSeq(strings.TrimSuffix(string(doc), "\n"), "\n") {
		k, _, ok := strings.Cut(line, " = ")
		if !ok {
			t.Fatalf("line %q is not key = value", line)
		}
		keys = append(keys, k)
	}
	return keys
}

// parseDoc parses a status document with a real TOML parser.
func parseDoc(t *testing.T, doc []byte) map[string]any {
	t.Helper()
	m := make(map[string]any)
	if _, err := toml.Decode(string(doc), &m); err != nil {
		t.Fatalf("status document does not parse as TOML: %v\n%s", err, doc)
	}
	return m
}

func TestStatusDocumentOptionalKeys(t *testing.T) {
	t.Parallel()
	full := Lease{
		ID: "lease-x", Resource: "a/b", Status: StatusComplete, Mode: ModeToken, Generation: 17,
		HolderUID: 1000, HolderPID: 4242, Host: "vm",
		StartedAt: testStart, HeartbeatAt: testStart, ExpiresAt: testStart.Add(time.Minute),
		CompletedAt: testStart.Add(time.Second), PID: 77, BootID: "boot",
		ActorSessionID: "as", TaskAssignmentID: "ta", AnchorState: "st", AnchorRoot: "ro", Path: "/p", Client: "cl",
		TakeoverRequestedBy: "uid 2", TakeoverRequestedAt: testStart.Add(2 * time.Second), TakeoverReason: "why", Waiters: 3,
	}
	wantFull := append(slices.Clone(requiredKeys), "completed_at", "pid", "boot_id", "actor_session_id",
		"task_assignment_id", "anchor_state", "anchor_root", "path", "client", "takeover_requested_by",
		"takeover_requested_at", "takeover_reason", "waiters")
	if keys := docKeys(t, StatusDocument(full)); !slices.Equal(keys, wantFull) {
		t.Errorf("full document keys =\n%v\nwant\n%v", keys, wantFull)
	}
	m := parseDoc(t, StatusDocument(full))
	if m["waiters"] != int64(3) || m["pid"] != int64(77) || m["takeover_reason"] != "why" {
		t.Errorf("optional values = %v", m)
	}

	handle := Lease{ID: "lease-y", Resource: "h", Status: StatusActive, Mode: ModeHandle, Generation: 2,
		StartedAt: testStart, HeartbeatAt: testStart, HolderPID: -1}
	wantHandle := []string{"resource", "lease_id", "status", "mode", "generation", "holder_uid",
		"holder_pid", "host", "started_at", "heartbeat_at"}
	keys := docKeys(t, StatusDocument(handle))
	if !slices.Equal(keys, wantHandle) {
		t.Errorf("handle document keys = %v, want %v (no expires_at, no unset optional keys)", keys, wantHandle)
	}
	if m := parseDoc(t, StatusDocument(handle)); m["holder_pid"] != int64(0) {
		t.Errorf("negative holder pid rendered as %v", m["holder_pid"])
	}
}

func TestStatusDocumentHostileStrings(t *testing.T) {
	t.Parallel()
	l := Lease{
		ID: "lease-x", Resource: "a \"quoted\" \\ name", Status: StatusActive, Mode: ModeToken,
		Host: "h\nx = 1", StartedAt: testStart, HeartbeatAt: testStart,
		ActorSessionID: "line1\nline2\r\n\x00\x1b[31m\x7f", Client: "tab\there",
		TakeoverReason: "\"\"\"triple\"\"\" '''lit'''",
	}
	m := parseDoc(t, StatusDocument(l))
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
	for _, f := range StatusFields(l) {
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
		q := QuoteTOML(in)
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
	if _, err := toml.Decode("K = "+QuoteTOML("a\xffb")+"\n", &v); err != nil {
		t.Errorf("QuoteTOML of invalid UTF-8 does not parse: %v", err)
	}
}
