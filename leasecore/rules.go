package leasecore

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/leasefs/leasefs/internal/procfs"
)

// The rules every store applies to what it is asked to record, so that
// every store validates and judges leases alike. All are pure functions,
// safe for concurrent use.

// maxAnnotationLen bounds each annotation string and takeover reason.
const maxAnnotationLen = 1024

// CheckText validates a string to be stored in a record (an annotation, a
// takeover request's fields): at most 1 KiB (maxAnnotationLen) of valid
// UTF-8 without NUL, so that every record written can be read back by a
// TOML parser. Errors: ErrInvalidArgument.
func CheckText(s string) error { return checkTextUpTo(s, maxAnnotationLen) }

// checkTextUpTo refuses text longer than max bytes, with NUL or not valid
// UTF-8. Errors: ErrInvalidArgument.
func checkTextUpTo(s string, max int) error {
	if len(s) > max || strings.ContainsRune(s, 0) || !utf8.ValidString(s) {
		return fmt.Errorf("%w: text longer than %d bytes, with NUL or not valid UTF-8", ErrInvalidArgument, max)
	}
	return nil
}

// ApplyAnnotations validates ann and applies it to l (docs/PROTOCOL.md
// §4.2), as [Store.Renew] does. Errors: ErrInvalidArgument for a key that is not an annotation, a
// string that breaks [CheckText], or a pid that is not a running process.
func ApplyAnnotations(l *Lease, ann Annotations) error {
	for key, v := range ann {
		f, ok := commandField(key)
		if !ok {
			return fmt.Errorf("%w: %q is not an annotation", ErrInvalidArgument, key)
		}
		if f.kind == kindString {
			if err := CheckText(v); err != nil {
				return err
			}
			f.value(l).SetString(v)
			continue
		}
		pid, err := strconv.Atoi(v)
		switch {
		case err != nil || pid < 0 || pid > maxPID:
			return fmt.Errorf("%w: pid %.20q out of range", ErrInvalidArgument, v)
		case pid == 0:
			l.PID, l.PIDStartTicks = 0, 0
			continue
		}
		ticks, ok := procfs.StartTicks(pid)
		if !ok {
			return fmt.Errorf("%w: pid %d is not a running process", ErrInvalidArgument, pid)
		}
		l.PID, l.PIDStartTicks = pid, ticks
	}
	return nil
}

// CheckEndStatus checks that status ends a lease (complete or abandoned).
// Errors: ErrInvalidArgument.
func CheckEndStatus(status Status) error {
	if status != StatusComplete && status != StatusAbandoned {
		return fmt.Errorf("%w: end status %q", ErrInvalidArgument, status)
	}
	return nil
}

// MaxNote is the longest holder's note in bytes (docs/PROTOCOL.md §4.2,
// "Notes").
const MaxNote = 256

// CheckNote validates a holder's note: at most [MaxNote] bytes of UTF-8
// without NUL. Errors: ErrInvalidArgument.
func CheckNote(note string) error { return checkTextUpTo(note, MaxNote) }

// CheckDraft validates d (its resource name and mode, docs/PROTOCOL.md §1)
// and returns it with the default mode (token) filled in. Errors:
// ErrInvalidName, ErrNameTooLong, ErrInvalidArgument.
func CheckDraft(d Draft) (Draft, error) {
	if err := ValidateResource(d.Resource); err != nil {
		return d, err
	}
	switch d.Mode {
	case "":
		d.Mode = ModeToken
	case ModeToken, ModeHandle:
	default:
		return d, fmt.Errorf("%w: mode %q", ErrInvalidArgument, d.Mode)
	}
	return d, nil
}

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
