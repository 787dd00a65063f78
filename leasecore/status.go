package leasecore

import (
	"fmt"
	"strings"
	"time"
)

// statusTime renders t as a TOML datetime with millisecond precision in UTC,
// e.g. 2026-11-30T02:00:00.000Z (docs/PROTOCOL.md §4.1).
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
