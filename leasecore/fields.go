package leasecore

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// The fields of a lease are defined once, by the `lease` struct tags of
// [Lease]; the status document, the extended attributes, the records on
// disk, the JSON of "leasefs ls --json" and the keys a write command may set
// are all derived from that one table (docs/PROTOCOL.md §4), so adding a
// field is one line and the views cannot drift apart.
//
// A tag is `lease:"KEY[,OPTION…]"`. KEY names the field in the status
// document, the xattrs (user.lease.KEY), JSON and commands. Options:
//
//	optional   omitted from every view while it has its zero value
//	recordopt  omitted from records while it has its zero value, which no
//	           real value has (a pid of 0, an empty host name); shown in
//	           the other views, where the key is required
//	record=K   named K in records (the reference store's name)
//	norecord   not written to records (derived, e.g. expires_at)
//	nostatus   only in records (e.g. holder_gid, pid_start_ticks)
//	command    settable by a write command as an annotation (§4.2)

// fieldKind is the type of a field's value.
type fieldKind int

const (
	kindString fieldKind = iota // string, Status, Mode
	kindInt                     // non-negative integers of any width
	kindTime                    // time.Time, UTC
)

// field is one lease field, parsed from its struct tag.
type field struct {
	key      string // status document, xattr, JSON and command key
	record   string // key in records; "" when not recorded
	status   bool   // shown in the status document, xattrs and JSON
	optional bool
	// recordOpt: omitted from records while unset (the recordopt option).
	recordOpt bool
	command   bool
	kind      fieldKind
	index     int // index in Lease
}

// leaseFields is the table of lease fields in status document order.
var leaseFields = parseFields(reflect.TypeFor[Lease]())

// parseFields reads the `lease` tags of t. A malformed tag is a programming
// error and panics at package initialisation.
func parseFields(t reflect.Type) []field {
	var out []field
	for i := range t.NumField() {
		sf := t.Field(i)
		tag, ok := sf.Tag.Lookup("lease")
		if !ok {
			continue
		}
		parts := strings.Split(tag, ",")
		f := field{key: parts[0], record: parts[0], status: true, index: i}
		for _, opt := range parts[1:] {
			switch {
			case opt == "optional":
				f.optional = true
			case opt == "recordopt":
				f.recordOpt = true
			case opt == "norecord":
				f.record = ""
			case opt == "nostatus":
				f.status = false
			case opt == "command":
				f.command = true
			case strings.HasPrefix(opt, "record="):
				f.record = strings.TrimPrefix(opt, "record=")
			default:
				panic(fmt.Sprintf("leasecore: field %s: unknown tag option %q", sf.Name, opt))
			}
		}
		switch sf.Type.Kind() {
		case reflect.String:
			f.kind = kindString
		case reflect.Int, reflect.Int64, reflect.Uint32, reflect.Uint64:
			f.kind = kindInt
		case reflect.Struct:
			if sf.Type != reflect.TypeFor[time.Time]() {
				panic("leasecore: field " + sf.Name + ": unsupported type")
			}
			f.kind = kindTime
		default:
			panic("leasecore: field " + sf.Name + ": unsupported type")
		}
		out = append(out, f)
	}
	return out
}

// commandField returns the field a write command may set under key.
func commandField(key string) (field, bool) {
	for _, f := range leaseFields {
		if f.command && f.key == key {
			return f, true
		}
	}
	return field{}, false
}

// IsAnnotationKey reports whether key names a field that a write command
// may set (docs/PROTOCOL.md §4.2), e.g. "anchor_state" or "pid".
func IsAnnotationKey(key string) bool {
	_, ok := commandField(key)
	return ok
}

// IsIntegerAnnotation reports whether the annotation key takes an integer
// ("pid") rather than a string.
func IsIntegerAnnotation(key string) bool {
	f, ok := commandField(key)
	return ok && f.kind == kindInt
}

// value returns field f of l.
func (f field) value(l *Lease) reflect.Value { return reflect.ValueOf(l).Elem().Field(f.index) }

// unset reports whether f of l has its zero value.
func (f field) unset(l *Lease) bool { return f.value(l).IsZero() }

// uint returns an integer field's value; negative values read as 0.
func uintOf(v reflect.Value) uint64 {
	if v.CanInt() {
		return uint64(max(v.Int(), 0))
	}
	return v.Uint()
}

// raw renders f of l without quoting: the xattr value.
func (f field) raw(l *Lease) string {
	v := f.value(l)
	switch f.kind {
	case kindInt:
		return strconv.FormatUint(uintOf(v), 10)
	case kindTime:
		return statusTime(v.Interface().(time.Time))
	}
	return v.String()
}

// statusTOML renders f of l as a status document value: strings quoted,
// times as native TOML datetimes with milliseconds.
func (f field) statusTOML(l *Lease) string {
	if f.kind == kindString {
		return QuoteTOML(f.value(l).String())
	}
	return f.raw(l)
}

// recordTOML renders f of l as a record value: times as RFC 3339 UTC
// strings with nanoseconds, as the reference store writes them
// (docs/PROTOCOL.md §4.3). Integers are written as they are, so that a
// corrupt value is caught on load rather than hidden.
func (f field) recordTOML(l *Lease) string {
	v := f.value(l)
	switch f.kind {
	case kindInt:
		if v.CanInt() {
			return strconv.FormatInt(v.Int(), 10)
		}
		return strconv.FormatUint(v.Uint(), 10)
	case kindTime:
		return QuoteTOML(v.Interface().(time.Time).UTC().Format(time.RFC3339Nano))
	}
	return QuoteTOML(v.String())
}

// set stores a decoded TOML value into f of l. Strings accept strings;
// integers accept non-negative integers that fit the field; times accept
// RFC 3339 strings and native TOML offset datetimes.
func (f field) set(l *Lease, x any) error {
	switch f.kind {
	case kindString:
		s, ok := x.(string)
		if !ok {
			return fmt.Errorf("%s: want a string, got %T", f.key, x)
		}
		f.setString(l, s)
	case kindInt:
		n, ok := x.(int64)
		if !ok {
			return fmt.Errorf("%s: want an integer, got %T", f.key, x)
		}
		return f.setInt(l, n)
	case kindTime:
		switch x := x.(type) {
		case string:
			return f.setTimeText(l, x)
		case time.Time:
			f.setTime(l, x)
		default:
			return fmt.Errorf("%s: want a time, got %T", f.key, x)
		}
	}
	return nil
}

// setString stores string s into string field f of l.
func (f field) setString(l *Lease, s string) { f.value(l).SetString(s) }

// setInt stores n into integer field f of l; negative values and values
// the field cannot hold are errors.
func (f field) setInt(l *Lease, n int64) error {
	if n < 0 {
		return fmt.Errorf("%s: %d is negative", f.key, n)
	}
	v := f.value(l)
	if v.CanInt() {
		if v.OverflowInt(n) {
			return fmt.Errorf("%s: %d out of range", f.key, n)
		}
		v.SetInt(n)
		return nil
	}
	if v.OverflowUint(uint64(n)) {
		return fmt.Errorf("%s: %d out of range", f.key, n)
	}
	v.SetUint(uint64(n))
	return nil
}

// setTimeText stores the RFC 3339 time s into time field f of l, in UTC.
func (f field) setTimeText(l *Lease, s string) error {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return fmt.Errorf("%s: bad time %q", f.key, s)
	}
	f.setTime(l, t)
	return nil
}

// setTime stores t into time field f of l, in UTC.
func (f field) setTime(l *Lease, t time.Time) {
	*f.value(l).Addr().Interface().(*time.Time) = t.UTC()
}

// Field is one key of the status document (docs/PROTOCOL.md §4.1), with its
// value rendered as TOML (strings quoted, times as native TOML datetimes)
// and raw (for extended attributes: unquoted).
type Field struct {
	Key  string
	TOML string
	Raw  string
}

// StatusFields returns the fields of the status document of l in document
// order, omitting optional fields that are unset. Never includes the token
// or its hash.
func StatusFields(l Lease) []Field {
	out := make([]Field, 0, len(leaseFields))
	for _, f := range leaseFields {
		if !f.status || f.optional && f.unset(&l) {
			continue
		}
		out = append(out, Field{Key: f.key, TOML: f.statusTOML(&l), Raw: f.raw(&l)})
	}
	return out
}

// StatusDocument renders the status document of l (docs/PROTOCOL.md §4.1):
// TOML, one "key = value" line per field of [StatusFields].
func StatusDocument(l Lease) []byte {
	var b strings.Builder
	for _, f := range StatusFields(l) {
		b.WriteString(f.Key)
		b.WriteString(" = ")
		b.WriteString(f.TOML)
		b.WriteByte('\n')
	}
	return []byte(b.String())
}

// MarshalJSON renders l as a JSON object with exactly the keys of its
// status document, in the same order: strings as strings, integers as
// numbers, times as RFC 3339 UTC strings (docs/PROTOCOL.md §8).
func (l Lease) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	first := true
	for _, f := range leaseFields {
		if !f.status || f.optional && f.unset(&l) {
			continue
		}
		if !first {
			b.WriteByte(',')
		}
		first = false
		key, _ := json.Marshal(f.key)
		b.Write(key)
		b.WriteByte(':')
		v := f.value(&l)
		var val []byte
		switch f.kind {
		case kindInt:
			val = []byte(strconv.FormatUint(uintOf(v), 10))
		case kindTime:
			val, _ = json.Marshal(v.Interface().(time.Time).UTC().Format(time.RFC3339Nano))
		default:
			val, _ = json.Marshal(v.String())
		}
		b.Write(val)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}
