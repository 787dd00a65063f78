package leasecore

import (
	"bytes"
	"unicode/utf8"
)

// The fast path of record decoding. A store of 100,000 leases loads
// 100,000 records at every start and every "leasefs ls"; a general TOML
// decoder into map[string]any spends most of that time building maps and
// boxing values. Records leasefs writes itself (see [EncodeRecord]) have a
// fixed shape, and [decodeCanonical] reads exactly that shape:
//
//	KEY = "TEXT"\n      TEXT without '\', '"' or control characters, valid UTF-8
//	KEY = DIGITS\n      0, or 1–18 digits without a leading zero
//
// one known record key per line, each at most once, nothing else: no
// comments, blank lines, other spacing, escapes, signs, underscores, native
// datetimes, tables or unknown keys. Every such input is also valid TOML
// meaning the same values, which the tests check against the general
// decoder (FuzzDecodeCanonical). Anything else is declined, and
// [DecodeRecord] hands it to the general decoder, which accepts all of
// TOML: records of the reference store, native datetimes, unknown keys.

// recordKeys maps a record key to its field in leaseFields; tokenHashKey
// maps to -1.
var recordKeys = func() map[string]int {
	m := map[string]int{tokenHashKey: -1}
	for i, f := range leaseFields {
		if f.record != "" {
			m[f.record] = i
		}
	}
	return m
}()

// maxCanonicalDigits bounds an integer of the fast path so that it fits an
// int64 without overflow checks.
const maxCanonicalDigits = 18

// decodeCanonical decodes data into *l, which must be the zero Lease, when
// data is a record in leasefs's canonical form (see above), and reports
// whether it was. When ok is false, nothing is decided, *l holds garbage
// and the caller must use the general decoder. When ok is true, *l (not yet
// checked by [validateRecord]) and the token hash are exactly those the
// general decoder would give. Decoding into the caller's lease spares a
// copy of it on the heap. intern, when not nil, returns a shared copy of a
// string value (host, boot id, client) that many records repeat; values it
// returns must equal its argument.
func decodeCanonical(l *Lease, data []byte, intern func([]byte) string) (hash string, ok bool) {
	if len(data) == 0 || len(data) > MaxRecordBytes || data[len(data)-1] != '\n' {
		return "", false
	}
	var seen uint64 // bit i+1: field i of leaseFields; bit 0: token_hash
	var setErr error
	for rest := data; len(rest) > 0; {
		nl := bytes.IndexByte(rest, '\n')
		line := rest[:nl]
		rest = rest[nl+1:]
		eq := bytes.Index(line, []byte(" = "))
		if eq <= 0 {
			return "", false
		}
		key, val := line[:eq], line[eq+3:]
		idx, known := recordKeys[string(key)]
		if !known || len(val) == 0 {
			return "", false
		}
		bit := uint64(1) << uint(idx+1)
		if seen&bit != 0 {
			return "", false // a duplicate key is a TOML error
		}
		seen |= bit
		if val[0] == '"' {
			text, ok := canonicalString(val)
			if !ok {
				return "", false
			}
			if idx < 0 {
				hash = string(text)
				continue
			}
			f := leaseFields[idx]
			switch f.kind {
			case kindString:
				f.setString(l, internValue(f, text, intern))
			case kindTime:
				if e := f.setTimeText(l, string(text)); e != nil && setErr == nil {
					setErr = e
				}
			default:
				// A string where an integer belongs: the general decoder
				// reports it.
				return "", false
			}
			continue
		}
		n, ok := canonicalInt(val)
		if !ok || idx < 0 || leaseFields[idx].kind != kindInt {
			return "", false
		}
		if e := leaseFields[idx].setInt(l, n); e != nil && setErr == nil {
			setErr = e
		}
	}
	if setErr != nil {
		// The general decoder applies fields in table order and stops at
		// the first error; let it produce the same one.
		return "", false
	}
	if l.Mode == "" {
		l.Mode = ModeToken
	}
	return hash, true
}

// canonicalString returns the text between the quotes of a canonical TOML
// basic string: no escapes, no quote, no control characters, valid UTF-8.
func canonicalString(val []byte) ([]byte, bool) {
	if len(val) < 2 || val[len(val)-1] != '"' {
		return nil, false
	}
	text := val[1 : len(val)-1]
	ascii := true
	for _, c := range text {
		switch {
		case c < 0x20 || c == 0x7f || c == '"' || c == '\\':
			return nil, false
		case c >= 0x80:
			ascii = false
		}
	}
	if !ascii && !utf8.Valid(text) {
		return nil, false
	}
	return text, true
}

// canonicalInt parses a canonical TOML integer: "0", or up to
// maxCanonicalDigits digits without a leading zero.
func canonicalInt(val []byte) (int64, bool) {
	if len(val) > maxCanonicalDigits || len(val) > 1 && val[0] == '0' {
		return 0, false
	}
	var n int64
	for _, c := range val {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// internValue returns text as a string, through intern for the fields that
// many records share, and as the package's constants for status and mode.
func internValue(f field, text []byte, intern func([]byte) string) string {
	switch f.key {
	case "status":
		for _, s := range []Status{StatusActive, StatusComplete, StatusAbandoned} {
			if string(text) == string(s) {
				return string(s)
			}
		}
	case "mode":
		for _, m := range []Mode{ModeToken, ModeHandle} {
			if string(text) == string(m) {
				return string(m)
			}
		}
	case "host", "boot_id", "client", "anchor_root", "anchor_state", "actor_session_id":
		if intern != nil {
			return intern(text)
		}
	}
	return string(text)
}

// CanonicalString decodes val, a TOML basic string in the canonical form
// [QuoteTOML] writes (quotes included), and reports whether it was one;
// when it was not, the caller uses the general TOML decoder.
func CanonicalString(val []byte) (string, bool) {
	text, ok := canonicalString(val)
	return string(text), ok
}
