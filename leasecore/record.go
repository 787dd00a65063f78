package leasecore

import (
	"bytes"
	"fmt"
	"time"

	"github.com/BurntSushi/toml"
)

// recordTime is a time in a record: written as an RFC 3339 UTC string with
// nanoseconds, as the reference store writes it; read from such a string or
// from a native TOML datetime (SPEC §4.3).
type recordTime struct{ time.Time }

// MarshalText writes the time as an RFC 3339 UTC string.
func (t recordTime) MarshalText() ([]byte, error) {
	return []byte(t.UTC().Format(time.RFC3339Nano)), nil
}

// UnmarshalTOML accepts a string or a native TOML datetime.
func (t *recordTime) UnmarshalTOML(v any) error {
	switch v := v.(type) {
	case string:
		parsed, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return fmt.Errorf("bad time %q: %w", v, err)
		}
		t.Time = parsed
	case time.Time:
		t.Time = v
	default:
		return fmt.Errorf("bad time of type %T", v)
	}
	return nil
}

// record is the on-disk form of a lease: the reference store's fields
// first, then this project's (SPEC §4.3).
type record struct {
	LeaseID          string      `toml:"lease_id"`
	Thread           string      `toml:"thread"`
	ActorSessionID   string      `toml:"actor_session_id,omitempty"`
	TaskAssignmentID string      `toml:"task_assignment_id,omitempty"`
	AnchorState      string      `toml:"anchor_state,omitempty"`
	AnchorRoot       string      `toml:"anchor_root,omitempty"`
	Path             string      `toml:"path,omitempty"`
	TokenHash        string      `toml:"token_hash"`
	PID              int64       `toml:"pid,omitempty"`
	BootID           string      `toml:"boot_id,omitempty"`
	HeartbeatAt      recordTime  `toml:"heartbeat_at"`
	StartedAt        recordTime  `toml:"started_at"`
	Status           string      `toml:"status"`
	CompletedAt      *recordTime `toml:"completed_at,omitempty"`

	Generation          uint64      `toml:"generation,omitempty"`
	Mode                string      `toml:"mode,omitempty"`
	HolderUID           int64       `toml:"holder_uid"`
	HolderGID           int64       `toml:"holder_gid"`
	HolderPID           int64       `toml:"holder_pid,omitempty"`
	Host                string      `toml:"host,omitempty"`
	Client              string      `toml:"client,omitempty"`
	PIDStartTicks       uint64      `toml:"pid_start_ticks,omitempty"`
	TakeoverRequestedBy string      `toml:"takeover_requested_by,omitempty"`
	TakeoverRequestedAt *recordTime `toml:"takeover_requested_at,omitempty"`
	TakeoverReason      string      `toml:"takeover_reason,omitempty"`
}

// MaxGeneration is the largest generation a record may carry: far beyond
// any real count, and small enough that TOML (signed 64-bit integers) holds
// it and inode numbers derived from it cannot wrap.
const MaxGeneration = 1 << 48

// maxRecordBytes bounds the size of a record file that will be parsed; a
// larger file is corrupt or hostile.
const maxRecordBytes = 1 << 20

// encodeRecord renders r as TOML.
func encodeRecord(r *record) ([]byte, error) {
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(r); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// decodeRecord parses and validates a record. It never panics on hostile
// input; it returns an error for anything that is not a well-formed lease.
func decodeRecord(data []byte) (*record, error) {
	if len(data) > maxRecordBytes {
		return nil, fmt.Errorf("record of %d bytes exceeds %d", len(data), maxRecordBytes)
	}
	var r record
	if _, err := toml.Decode(string(data), &r); err != nil {
		return nil, err
	}
	if err := ValidateLeaseID(r.LeaseID); err != nil {
		return nil, err
	}
	if err := ValidateResource(r.Thread); err != nil {
		return nil, err
	}
	switch Status(r.Status) {
	case StatusActive, StatusComplete, StatusAbandoned:
	default:
		return nil, fmt.Errorf("unknown status %q", r.Status)
	}
	switch Mode(r.Mode) {
	case "", ModeToken, ModeHandle:
	default:
		return nil, fmt.Errorf("unknown mode %q", r.Mode)
	}
	if r.HeartbeatAt.IsZero() || r.StartedAt.IsZero() {
		return nil, fmt.Errorf("missing heartbeat_at or started_at")
	}
	if r.Generation > MaxGeneration {
		return nil, fmt.Errorf("generation %d out of range", r.Generation)
	}
	if r.PID < 0 || r.PID > 1<<22 || r.HolderUID < 0 || r.HolderUID > 1<<32-1 ||
		r.HolderGID < 0 || r.HolderGID > 1<<32-1 || r.HolderPID < 0 || r.HolderPID > 1<<31-1 {
		return nil, fmt.Errorf("pid or uid out of range")
	}
	return &r, nil
}

func optTime(t time.Time) *recordTime {
	if t.IsZero() {
		return nil
	}
	return &recordTime{t.UTC()}
}

func (t *recordTime) value() time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// toRecord converts a lease and its token hash to the on-disk form.
func toRecord(l *Lease, tokenHash string) *record {
	return &record{
		LeaseID:             l.ID,
		Thread:              l.Resource,
		ActorSessionID:      l.ActorSessionID,
		TaskAssignmentID:    l.TaskAssignmentID,
		AnchorState:         l.AnchorState,
		AnchorRoot:          l.AnchorRoot,
		Path:                l.Path,
		TokenHash:           tokenHash,
		PID:                 int64(l.PID),
		BootID:              l.BootID,
		HeartbeatAt:         recordTime{l.HeartbeatAt.UTC()},
		StartedAt:           recordTime{l.StartedAt.UTC()},
		Status:              string(l.Status),
		CompletedAt:         optTime(l.CompletedAt),
		Generation:          l.Generation,
		Mode:                string(l.Mode),
		HolderUID:           int64(l.HolderUID),
		HolderGID:           int64(l.HolderGID),
		HolderPID:           int64(l.HolderPID),
		Host:                l.Host,
		Client:              l.Client,
		PIDStartTicks:       l.PIDStartTicks,
		TakeoverRequestedBy: l.TakeoverRequestedBy,
		TakeoverRequestedAt: optTime(l.TakeoverRequestedAt),
		TakeoverReason:      l.TakeoverReason,
	}
}

// fromRecord converts a validated record to a lease (ExpiresAt is filled in
// by the store, which knows the lease duration).
func fromRecord(r *record) Lease {
	mode := Mode(r.Mode)
	if mode == "" {
		mode = ModeToken
	}
	return Lease{
		ID:                  r.LeaseID,
		Resource:            r.Thread,
		Status:              Status(r.Status),
		Mode:                mode,
		Generation:          r.Generation,
		HolderUID:           uint32(r.HolderUID),
		HolderGID:           uint32(r.HolderGID),
		HolderPID:           int(r.HolderPID),
		Host:                r.Host,
		StartedAt:           r.StartedAt.UTC(),
		HeartbeatAt:         r.HeartbeatAt.UTC(),
		CompletedAt:         r.CompletedAt.value(),
		PID:                 int(r.PID),
		PIDStartTicks:       r.PIDStartTicks,
		BootID:              r.BootID,
		ActorSessionID:      r.ActorSessionID,
		TaskAssignmentID:    r.TaskAssignmentID,
		AnchorState:         r.AnchorState,
		AnchorRoot:          r.AnchorRoot,
		Path:                r.Path,
		Client:              r.Client,
		TakeoverRequestedBy: r.TakeoverRequestedBy,
		TakeoverRequestedAt: r.TakeoverRequestedAt.value(),
		TakeoverReason:      r.TakeoverReason,
	}
}
