package storetest

import (
	"regexp"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// RequiredStatusKeys are the status document keys of docs/PROTOCOL.md §4.1
// that every token lease shows, in order.
var RequiredStatusKeys = []string{
	"resource", "lease_id", "status", "mode", "generation", "holder_uid",
	"holder_pid", "host", "started_at", "heartbeat_at", "expires_at",
}

// StatusTimePattern matches a time of a status document: a UTC datetime
// to the millisecond (docs/PROTOCOL.md §4.1).
var StatusTimePattern = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)

// DocKeys returns the keys of status document doc in order, and fails t on
// a line that is not "key = value".
func DocKeys(t testing.TB, doc []byte) []string {
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

// ParseDoc parses status document doc with a real TOML parser, and fails t
// when it does not parse.
func ParseDoc(t testing.TB, doc []byte) map[string]any {
	t.Helper()
	m := make(map[string]any)
	if _, err := toml.Decode(string(doc), &m); err != nil {
		t.Fatalf("status document does not parse as TOML: %v\n%s", err, doc)
	}
	return m
}
