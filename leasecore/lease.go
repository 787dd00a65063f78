package leasecore

import (
	"context"
	"strconv"
	"strings"
	"time"
)

// Status is the lifecycle state of a lease (docs/PROTOCOL.md §4.1).
type Status string

// Lease statuses. Only [StatusActive] leases can be live.
const (
	StatusActive    Status = "active"
	StatusComplete  Status = "complete"
	StatusAbandoned Status = "abandoned"
)

// Mode says what keeps a lease alive (docs/PROTOCOL.md §1).
type Mode string

// Lease modes.
const (
	// ModeToken leases live while their holder writes its token at least
	// once per lease duration.
	ModeToken Mode = "token"
	// ModeHandle leases live exactly as long as one open file (docs/PROTOCOL.md §6).
	ModeHandle Mode = "handle"
)

// DefaultLeaseDuration is the heartbeat TTL of token leases (docs/PROTOCOL.md §1).
const DefaultLeaseDuration = 5 * time.Minute

// DefaultHistoryKeep is the number of ended records kept (docs/PROTOCOL.md §4.3).
const DefaultHistoryKeep = 10000

// DefaultMaxLeasesPerUID is the per-uid limit on live leases (docs/PROTOCOL.md §7).
const DefaultMaxLeasesPerUID = 10000

// Annotations are holder-supplied fields of a lease, keyed by field name:
// the fields whose `lease` tag says "command" (actor_session_id,
// task_assignment_id, anchor_state, anchor_root, path, client, pid;
// docs/PROTOCOL.md §4.2). String values are at most 1 KiB of UTF-8 without
// NUL; an empty string clears the field. "pid" is a decimal process id that
// must be running, naming a long-lived holder process for early death
// detection (§5 rule 2); "0" clears it. A key that is absent leaves the
// field as it is.
type Annotations map[string]string

// Lease is a copy of one lease record. Values are snapshots: changing one
// changes nothing in the store. The token hash is deliberately absent.
//
// The struct tags are the one definition of the lease's fields for every
// view of it (status document, xattrs, records, JSON, commands): see
// fields.go. Fields are in status document order (docs/PROTOCOL.md §4.1).
type Lease struct {
	Resource   string `lease:"resource,record=thread"` // the lease file's path relative to the mount root
	ID         string `lease:"lease_id"`               // "lease-…"
	Status     Status `lease:"status"`
	Mode       Mode   `lease:"mode"`
	Generation uint64 `lease:"generation"` // fencing number, strictly increasing per store (§1)

	HolderUID uint32 `lease:"holder_uid"`
	HolderGID uint32 `lease:"holder_gid,nostatus"`
	HolderPID int    `lease:"holder_pid,recordopt"` // the process that reserved (informational)
	Host      string `lease:"host,recordopt"`       // host name of the reserving daemon

	StartedAt   time.Time `lease:"started_at"`
	HeartbeatAt time.Time `lease:"heartbeat_at"`
	// ExpiresAt is HeartbeatAt plus the lease duration for active token
	// leases; zero for handle leases, which never expire by time, and for
	// ended ones. Derived by the store, never recorded.
	ExpiresAt   time.Time `lease:"expires_at,optional,norecord"`
	CompletedAt time.Time `lease:"completed_at,optional"` // zero while active

	// PID, PIDStartTicks and BootID are the liveness facts of §5: a
	// recorded holder process (with its start time in clock ticks since
	// boot, to detect pid reuse) and the boot it lives in.
	PID           int    `lease:"pid,optional,command"`
	PIDStartTicks uint64 `lease:"pid_start_ticks,optional,nostatus"`
	BootID        string `lease:"boot_id,optional"`

	ActorSessionID   string `lease:"actor_session_id,optional,command"`
	TaskAssignmentID string `lease:"task_assignment_id,optional,command"`
	AnchorState      string `lease:"anchor_state,optional,command"`
	AnchorRoot       string `lease:"anchor_root,optional,command"`
	Path             string `lease:"path,optional,command"`
	Client           string `lease:"client,optional,command"`
	// Note is the holder's note: text up to [MaxNote] bytes that a
	// handle lease's holder wrote through its open file, as lock
	// libraries write their pid or a line into the lock file
	// (docs/PROTOCOL.md §4.2, "Notes").
	Note string `lease:"note,optional"`

	TakeoverRequestedBy string    `lease:"takeover_requested_by,optional"`
	TakeoverRequestedAt time.Time `lease:"takeover_requested_at,optional"`
	TakeoverReason      string    `lease:"takeover_reason,optional"`

	// Waiters is the number of blocked flock waiters on the resource of a
	// live lease (§6), kept by the daemon; never recorded.
	Waiters int `lease:"waiters,optional,norecord"`

	// Daemon is [DaemonPrevious] for a handle lease whose open file was
	// opened through a previous daemon and that a process still holds
	// (docs/PROTOCOL.md §2, "Handle leases across restarts"), "" otherwise;
	// HolderPIDs then lists the processes found holding it when this
	// daemon started ("812 815"). Set by the store at open, cleared when
	// the lease binds to a new open file; never recorded.
	Daemon     string `lease:"daemon,optional,norecord"`
	HolderPIDs string `lease:"holder_pids,optional,norecord"`

	// KeepAliveUntil is, for a handle lease that an etcd store keeps
	// alive, its local deadline (docs/PROTOCOL.md §8a): the lease ends then
	// unless a keep-alive the cluster answers moves it, and the cluster
	// cannot expire it before this plus the margin of §8a. "leasefs lock"
	// stops its command by then when it cannot reach its daemon (§8).
	// Zero for every other lease; never recorded.
	KeepAliveUntil time.Time `lease:"keepalive_until,optional,norecord"`
}

// DaemonPrevious is [Lease.Daemon] of a handle lease held through a
// previous daemon's mount.
const DaemonPrevious = "previous"

// FormatPIDs renders pids as [Lease.HolderPIDs] does: decimal, separated
// by single spaces.
func FormatPIDs(pids []int) string {
	parts := make([]string, len(pids))
	for i, p := range pids {
		parts[i] = strconv.Itoa(p)
	}
	return strings.Join(parts, " ")
}

// Live reports whether the lease's status is active. Liveness rules beyond
// the status are applied by the store, which ends dead leases.
func (l Lease) Live() bool { return l.Status == StatusActive }

// Draft describes a lease to reserve.
type Draft struct {
	Resource  string
	Mode      Mode // ModeToken when empty
	HolderUID uint32
	HolderGID uint32
	HolderPID int
	// Annotations are applied to the new lease; see [Annotations].
	Annotations Annotations
}

// Grant is a reserved lease and its bearer token. The token exists only in
// this value: the store keeps its hash (docs/PROTOCOL.md §1).
type Grant struct {
	Lease Lease
	Token string
}

// TakeoverRequest is a request, by someone who does not hold the token, that
// the holder give the lease up (docs/PROTOCOL.md §4.2). It changes nothing else.
type TakeoverRequest struct {
	By     string // who asks, e.g. "uid 1000 pid 4242"
	Reason string // free text, at most 1 KiB
}

// Namespace is a persistent directory of resources (docs/PROTOCOL.md §3).
type Namespace struct {
	Path      string // "" is the root
	UID       uint32 // creator
	GID       uint32
	CreatedAt time.Time
}

// Store is the lease store behind a leasefs mount. The file store
// (package filestore) is the default, the memory store (internal/engine)
// keeps leases in memory, and other stores (etcdstore) implement the same
// contract; the contract suite
// in leasecore/storetest checks every implementation. All methods are safe
// for concurrent use.
//
// Reads are pure: they never change the store. A lease that a liveness
// rule (docs/PROTOCOL.md §5) has killed is reported as ended (Live and the
// listings omit it, Load shows it abandoned); ending it durably is the
// store's own business, and every end — by a holder, by a rule, or by
// another mount of a shared store — is published on the change feed
// ([Store.Watch]).
//
// Methods that change the store return only after the change is durable.
// On a *[PersistError] nothing changed, unless the error also matches
// [ErrOutcomeUnknown]: then the change may or may not have been applied
// (a network store that timed out, a directory fsync that failed after the
// rename), and the next read tells which. ctx bounds waits on a network or
// on a queue.
type Store interface {
	// Reserve grants a new lease on d.Resource if it has no live lease.
	// A name being handed to the head of its queue of Acquire callers
	// counts as held, by the head's grant: no Reserve passes a waiter
	// (docs/PROTOCOL.md §6, §8a "Hand-over"). Errors: *LeaseHeldError (ErrHeld), ErrQuota, ErrNoNamespace,
	// ErrIsNamespace, ErrInvalidName, ErrNameTooLong, ErrInvalidArgument,
	// *PersistError.
	Reserve(ctx context.Context, d Draft) (Grant, error)
	// Acquire is Reserve that waits while another holds the name, first
	// come first served among the callers of Acquire on that name, across
	// every mount of the store (docs/PROTOCOL.md §6). A waiting caller
	// counts in the Waiters of the live lease. Errors: those of Reserve
	// except ErrHeld; ctx.Err() when ctx ends first, with nothing
	// reserved; ErrClosed when the store closes. A grant made before the
	// call saw ctx end is returned with a nil error even if ctx has ended
	// by then: the lease is the caller's to use or end (a lock granted an
	// instant before a signal arrived, for fcntl(2) F_SETLKW).
	Acquire(ctx context.Context, d Draft) (Grant, error)
	// Live returns the live lease on resource. Errors: ErrNotFound.
	Live(ctx context.Context, resource string) (Lease, error)
	// Load returns the lease with that id in any status.
	// Errors: ErrInvalidID, ErrNotFound.
	Load(ctx context.Context, id string) (Lease, error)
	// Renew authenticates token against lease id, moves its heartbeat to now
	// and applies ann. Errors: ErrNotFound, ErrInactive (ended or dead),
	// ErrTokenMismatch, ErrInvalidArgument, *PersistError.
	Renew(ctx context.Context, id, token string, ann Annotations) (Lease, error)
	// Release authenticates token, applies ann and ends lease id with status
	// (complete or abandoned), in one durable change. Errors: as Renew.
	Release(ctx context.Context, id, token string, status Status, ann Annotations) (Lease, error)
	// End ends lease id with status without a token: the caller has
	// authorised the holder by other means (unlink by the holder uid, a
	// closed handle). Errors: ErrNotFound, ErrInactive, *PersistError.
	End(ctx context.Context, id string, status Status) (Lease, error)
	// Bind turns live lease id into a handle lease held by process
	// holderPID (docs/PROTOCOL.md §6): mode handle, no expiry by time; it
	// then ends only by [Store.End] or [Store.Release]. Binding a handle
	// lease again only records a new holderPID (another process of the
	// same open file locked it again). Errors: ErrNotFound, ErrInactive,
	// *PersistError.
	Bind(ctx context.Context, id string, holderPID int) (Lease, error)
	// Note records note as the holder's note of live lease id, replacing
	// any earlier one ("" clears it); the caller has authorised the holder
	// (the open file that holds a handle lease). Errors: ErrNotFound,
	// ErrInactive, ErrInvalidArgument (over [MaxNote] bytes, NUL, not
	// UTF-8), *PersistError.
	Note(ctx context.Context, id, note string) (Lease, error)
	// RequestTakeover records a takeover request on live lease id.
	// Errors: ErrNotFound, ErrInactive, ErrInvalidArgument, *PersistError.
	RequestTakeover(ctx context.Context, id string, req TakeoverRequest) (Lease, error)
	// List returns every live lease, sorted by resource.
	List(ctx context.Context) ([]Lease, error)
	// ListDir returns the namespaces and live leases directly inside
	// namespace dir ("" is the root), each sorted by name.
	// Errors: ErrNoNamespace.
	ListDir(ctx context.Context, dir string) ([]Namespace, []Lease, error)
	// History returns ended leases, newest first; all resources when
	// resource is "".
	History(ctx context.Context, resource string) ([]Lease, error)
	// Namespace returns the namespace at path. Errors: ErrNotFound.
	Namespace(ctx context.Context, path string) (Namespace, error)
	// Mkdir creates namespace path. Errors: ErrExists, ErrNoNamespace,
	// ErrQuota, ErrInvalidName, ErrNameTooLong, *PersistError.
	Mkdir(ctx context.Context, path string, uid, gid uint32) (Namespace, error)
	// Rmdir removes an empty namespace. Errors: ErrNotFound, ErrNotEmpty,
	// *PersistError.
	Rmdir(ctx context.Context, path string) error
	// Watch returns the change feed: every [Event] from now on whose kind
	// is one of kinds (every event when none is given), in order for each
	// resource, until ctx is done or the store closes, when the channel
	// is closed. (The file store keeps one order for all; the etcd store
	// hears each name it follows on a watch of its own, so events of
	// different names may interleave otherwise, and it reports only the
	// names it follows: docs/PROTOCOL.md §8a.) Events
	// are queued without bound for each watcher, so a slow watcher delays
	// nobody and misses nothing; an event of a kind not asked for is not
	// queued and does not wake the watcher (a renew, the commonest change,
	// is an EventChanged).
	Watch(ctx context.Context, kinds ...EventKind) <-chan Event
	// Close releases the store's resources. Further calls return ErrClosed.
	Close() error
}
