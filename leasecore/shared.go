package leasecore

import "github.com/leasefs/leasefs/internal/procfs"

// Helpers for stores outside this package (the etcd store of
// docs/PROTOCOL.md §8a), so that every store validates, encodes and judges
// leases by the same rules as the file store. All are pure functions, safe
// for concurrent use.

// EncodeRecord renders lease l and its token hash as a record of
// docs/PROTOCOL.md §4.3: one "key = value" TOML line per recorded field,
// the reference store's names, optional fields omitted while unset.
func EncodeRecord(l *Lease, tokenHash string) []byte { return encodeRecord(l, tokenHash) }

// DecodeRecord parses and validates a record made by [EncodeRecord] (or by
// the reference store) and returns its lease, without the derived
// ExpiresAt, and its token hash. Unknown keys are ignored. Errors: a
// malformed or invalid record; it never panics on hostile input.
func DecodeRecord(data []byte) (Lease, string, error) { return decodeRecord(data) }

// ApplyAnnotations validates ann and applies it to l (docs/PROTOCOL.md
// §4.2), as [Store.Renew] does. Errors: ErrInvalidArgument.
func ApplyAnnotations(l *Lease, ann Annotations) error { return applyAnnotations(l, ann) }

// CheckText validates a string to be stored in a record (an annotation, a
// takeover request's fields): at most 1 KiB of valid UTF-8 without NUL.
// Errors: ErrInvalidArgument.
func CheckText(s string) error { return checkText(s) }

// CheckDraft validates d (its resource name and mode) and returns it with
// the default mode (token) filled in. Errors: ErrInvalidName,
// ErrNameTooLong, ErrInvalidArgument.
func CheckDraft(d Draft) (Draft, error) { return checkDraft(d) }

// CheckEndStatus checks that status ends a lease (complete or abandoned).
// Errors: ErrInvalidArgument.
func CheckEndStatus(status Status) error { return checkEndStatus(status) }

// ParentOf returns the namespace that contains resource: "" for a name at
// the root, "a" for "a/b".
func ParentOf(resource string) string { return parentOf(resource) }

// LocalDeadReason applies the pid and boot-id liveness rules of
// docs/PROTOCOL.md §5 (rules 2 and 3) to active lease l, recorded on this
// machine (its boot id is bootID, see [procfs.BootID]), and returns why it is
// dead, or "" when those rules leave it live. The caller applies them only
// to leases recorded by its own host (§8a).
func LocalDeadReason(l Lease, bootID string) string {
	switch {
	case l.BootID != "" && bootID != "" && l.BootID != bootID:
		return "machine rebooted"
	case l.PID > 0 && (l.BootID == "" || l.BootID == bootID) && procfs.Gone(l.PID, l.PIDStartTicks):
		return "holder process gone"
	}
	return ""
}

// CanonicalString decodes val, a TOML basic string in the canonical form
// [QuoteTOML] writes (quotes included), and reports whether it was one;
// when it was not, the caller uses the general TOML decoder.
func CanonicalString(val []byte) (string, bool) {
	text, ok := canonicalString(val)
	return string(text), ok
}
