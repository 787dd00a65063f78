package leasecore

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Field is one key of the status document (SPEC §4.1), with its value
// rendered as TOML (strings quoted, times as native TOML datetimes) and raw
// (for extended attributes: unquoted).
type Field struct {
	Key  string
	TOML string
	Raw  string
}

// statusTime renders t as a TOML datetime with millisecond precision in UTC,
// e.g. 2026-11-30T02:00:00.000Z (SPEC §4.1).
func statusTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// QuoteTOML renders s as a TOML basic string: quotes, backslashes and
// control characters escaped (TOML v1.0.0 §String).
func QuoteTOML(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// StatusFields returns the fields of the status document of l in document
// order, omitting optional fields that are unset. waiters > 0 adds the
// number of blocked flock waiters (SPEC §6). Never includes the token or its
// hash.
func StatusFields(l Lease, waiters int) []Field {
	var fs []Field
	str := func(k, v string) { fs = append(fs, Field{k, QuoteTOML(v), v}) }
	num := func(k string, v uint64) {
		s := strconv.FormatUint(v, 10)
		fs = append(fs, Field{k, s, s})
	}
	tm := func(k string, t time.Time) {
		s := statusTime(t)
		fs = append(fs, Field{k, s, s})
	}
	optStr := func(k, v string) {
		if v != "" {
			str(k, v)
		}
	}
	str("resource", l.Resource)
	str("lease_id", l.ID)
	str("status", string(l.Status))
	str("mode", string(l.Mode))
	num("generation", l.Generation)
	num("holder_uid", uint64(l.HolderUID))
	num("holder_pid", uint64(max(l.HolderPID, 0)))
	str("host", l.Host)
	tm("started_at", l.StartedAt)
	tm("heartbeat_at", l.HeartbeatAt)
	if !l.ExpiresAt.IsZero() {
		tm("expires_at", l.ExpiresAt)
	}
	if !l.CompletedAt.IsZero() {
		tm("completed_at", l.CompletedAt)
	}
	if l.PID > 0 {
		num("pid", uint64(l.PID))
	}
	optStr("boot_id", l.BootID)
	optStr("actor_session_id", l.ActorSessionID)
	optStr("task_assignment_id", l.TaskAssignmentID)
	optStr("anchor_state", l.AnchorState)
	optStr("anchor_root", l.AnchorRoot)
	optStr("path", l.Path)
	optStr("client", l.Client)
	optStr("takeover_requested_by", l.TakeoverRequestedBy)
	if !l.TakeoverRequestedAt.IsZero() {
		tm("takeover_requested_at", l.TakeoverRequestedAt)
	}
	optStr("takeover_reason", l.TakeoverReason)
	if waiters > 0 {
		num("waiters", uint64(waiters))
	}
	return fs
}

// StatusDocument renders the status document of l (SPEC §4.1): TOML, one
// "key = value" line per field of [StatusFields].
func StatusDocument(l Lease, waiters int) []byte {
	var b strings.Builder
	for _, f := range StatusFields(l, waiters) {
		b.WriteString(f.Key)
		b.WriteString(" = ")
		b.WriteString(f.TOML)
		b.WriteByte('\n')
	}
	return []byte(b.String())
}
