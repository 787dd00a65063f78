package leasecore

import (
	"errors"
	"fmt"
	"strings"

	"github.com/BurntSushi/toml"
)

// tokenHashKey is the record key of the blake3 hex digest of the token, the
// one record key that is not a field of [Lease].
const tokenHashKey = "token_hash"

// MaxGeneration is the largest generation a record may carry: far beyond
// any real count, and small enough that TOML (signed 64-bit integers) holds
// it and inode numbers derived from it cannot wrap.
const MaxGeneration = 1 << 48

// maxPID bounds a recorded pid: Linux's PID_MAX_LIMIT (2^22).
const maxPID = 1 << 22

// MaxRecordBytes bounds the size in bytes of a record (docs/PROTOCOL.md
// §4.3) that will be parsed; a
// larger file is corrupt or hostile.
const MaxRecordBytes = 1 << 20

// EncodeRecord renders lease l and its token hash as a record
// (docs/PROTOCOL.md §4.3): one "key = value" line per recorded field, the
// reference store's names, optional fields omitted while unset (and so
// are holder_pid and host, unset in records of the reference store).
func EncodeRecord(l *Lease, tokenHash string) []byte {
	var b strings.Builder
	for _, f := range leaseFields {
		if f.record == "" || (f.optional || f.recordOpt) && f.unset(l) {
			continue
		}
		b.WriteString(f.record)
		b.WriteString(" = ")
		b.WriteString(f.recordTOML(l))
		b.WriteByte('\n')
	}
	b.WriteString(tokenHashKey + " = " + QuoteTOML(tokenHash) + "\n")
	return []byte(b.String())
}

// DecodeRecord parses and validates a record and returns its lease (without
// ExpiresAt, which the store derives) and token hash. Unknown keys are
// ignored; a record of the reference store, which lacks this project's
// fields, loads as a token lease. It never panics on hostile input; it
// returns an error for anything that is not a well-formed lease.
//
// Records in leasefs's own canonical form take a fast path
// ([decodeCanonical]); everything else goes through the general TOML
// decoder ([decodeTOMLRecord]), with the same results.
func DecodeRecord(data []byte) (Lease, string, error) {
	var l Lease
	hash, err := DecodeRecordInto(&l, data, nil)
	return l, hash, err
}

// DecodeRecordInto is [DecodeRecord] into *l, which must be the zero
// Lease, sharing repeated string values through intern (see
// [decodeCanonical]); intern may be nil. On error *l is unspecified.
func DecodeRecordInto(l *Lease, data []byte, intern func([]byte) string) (string, error) {
	if hash, ok := decodeCanonical(l, data, intern); ok {
		return hash, validateRecord(l)
	}
	var err error
	var hash string
	*l, hash, err = decodeTOMLRecord(data)
	return hash, err
}

// decodeTOMLRecord is [DecodeRecord] through the general TOML decoder:
// any valid TOML, native datetimes, unknown keys ignored.
func decodeTOMLRecord(data []byte) (Lease, string, error) {
	if len(data) > MaxRecordBytes {
		return Lease{}, "", fmt.Errorf("record of %d bytes exceeds %d", len(data), MaxRecordBytes)
	}
	m := make(map[string]any)
	if _, err := toml.Decode(string(data), &m); err != nil {
		return Lease{}, "", err
	}
	var l Lease
	for _, f := range leaseFields {
		x, ok := m[f.record]
		if f.record == "" || !ok {
			continue
		}
		if err := f.set(&l, x); err != nil {
			return Lease{}, "", err
		}
	}
	hash, _ := m[tokenHashKey].(string)
	if l.Mode == "" {
		l.Mode = ModeToken
	}
	return l, hash, validateRecord(&l)
}

// validateRecord checks what the field types cannot: ids, names, enums,
// required times and ranges.
func validateRecord(l *Lease) error {
	if err := ValidateLeaseID(l.ID); err != nil {
		return err
	}
	if err := ValidateResource(l.Resource); err != nil {
		return err
	}
	switch l.Status {
	case StatusActive, StatusComplete, StatusAbandoned:
	default:
		return fmt.Errorf("unknown status %q", l.Status)
	}
	switch l.Mode {
	case ModeToken, ModeHandle:
	default:
		return fmt.Errorf("unknown mode %q", l.Mode)
	}
	switch {
	case l.HeartbeatAt.IsZero() || l.StartedAt.IsZero():
		return errors.New("missing heartbeat_at or started_at")
	case l.Generation > MaxGeneration:
		return fmt.Errorf("generation %d out of range", l.Generation)
	case l.PID > maxPID:
		return fmt.Errorf("pid %d out of range", l.PID)
	case l.HolderPID > 1<<31-1:
		return fmt.Errorf("holder_pid %d out of range", l.HolderPID)
	}
	return nil
}
