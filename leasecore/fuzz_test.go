package leasecore

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeRecord feeds the record loader truncated, corrupt and hostile
// TOML. It must never panic, and whatever it accepts must be a well-formed
// lease that survives an encode/decode round trip.
func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte(`lease_id = "lease-abc"
thread = "feature/a"
token_hash = "00"
heartbeat_at = "2026-11-30T02:00:00.123456789Z"
started_at = "2026-11-30T02:00:00Z"
status = "active"
`))
	f.Add([]byte(`lease_id = "lease-abc"
thread = "a"
token_hash = "00"
heartbeat_at = 2026-11-30T02:00:00Z
started_at = 2026-11-30T02:00:00Z
status = "complete"
completed_at = 2026-11-30T02:01:00Z
generation = 7
mode = "handle"
holder_uid = 1000
pid = 42
`))
	f.Add([]byte(`lease_id = "lease-x"` + "\n" + `thread = "` + strings.Repeat("a", 300) + `"`))
	f.Add([]byte("[[a]]\n[[a.b]]\n" + strings.Repeat("[", 1000)))
	f.Add([]byte(`status = "weird"`))
	f.Add([]byte("lease_id = \"lease-a\"\npid = -1\n"))
	f.Add([]byte{0xff, 0xfe, 0x00})
	f.Fuzz(func(t *testing.T, data []byte) {
		l, hash, err := DecodeRecord(data)
		if err != nil {
			return
		}
		if ValidateLeaseID(l.ID) != nil || ValidateResource(l.Resource) != nil {
			t.Fatalf("accepted a record with a bad id or resource: %+v", l)
		}
		out := EncodeRecord(&l, hash)
		again, hash2, err := DecodeRecord(out)
		if err != nil {
			t.Fatalf("a record written from an accepted one does not load: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(again, l) || hash2 != hash {
			t.Fatalf("round trip changed the record:\n got %+v\nwant %+v", again, l)
		}
	})
}

// FuzzValidateResource checks the naming rules of docs/PROTOCOL.md §3 on any input:
// no panic, every refusal is ErrInvalidName or ErrNameTooLong, and every
// accepted resource is valid UTF-8 with 1–255-byte components.
func FuzzValidateResource(f *testing.F) {
	for _, s := range []string{"a", "a/b", "", ".", "..", "a//b", "/a", "a/", "a\x00b", "\xff", strings.Repeat("x", 256), "é/ü"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := ValidateResource(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidName) && !errors.Is(err, ErrNameTooLong) {
				t.Fatalf("ValidateResource(%q) = %v: not a documented error", s, err)
			}
			return
		}
		if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
			t.Fatalf("accepted %q", s)
		}
		for part := range strings.SplitSeq(s, "/") {
			if len(part) == 0 || len(part) > MaxNameLen || part == "." || part == ".." {
				t.Fatalf("accepted %q with component %q", s, part)
			}
		}
	})
}
