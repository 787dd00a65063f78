package leasecore

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// maxAnnotationLen bounds each annotation string and takeover reason.
const maxAnnotationLen = 1024

// checkText validates a string that will be stored in a record: at most
// maxAnnotationLen bytes of valid UTF-8 without NUL, so that every record
// written can be read back by a TOML parser.
func checkText(s string) error {
	if len(s) > maxAnnotationLen || strings.ContainsRune(s, 0) || !utf8.ValidString(s) {
		return fmt.Errorf("%w: text longer than %d bytes, with NUL or not valid UTF-8", ErrInvalidArgument, maxAnnotationLen)
	}
	return nil
}

// applyAnnotations validates ann and applies it to l (docs/PROTOCOL.md
// §4.2). Errors: ErrInvalidArgument for a key that is not an annotation, a
// string that breaks [checkText], or a pid that is not a running process.
func applyAnnotations(l *Lease, ann Annotations) error {
	for key, v := range ann {
		f, ok := commandField(key)
		if !ok {
			return fmt.Errorf("%w: %q is not an annotation", ErrInvalidArgument, key)
		}
		if f.kind == kindString {
			if err := checkText(v); err != nil {
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
		ticks, ok := ProcessStartTicks(pid)
		if !ok {
			return fmt.Errorf("%w: pid %d is not a running process", ErrInvalidArgument, pid)
		}
		l.PID, l.PIDStartTicks = pid, ticks
	}
	return nil
}

// Reserve grants a new lease on d.Resource when it has no live lease; see
// [Store.Reserve]. A dead lease on the name is ended as abandoned first
// (docs/PROTOCOL.md §5). The record is durable before Reserve returns.
func (s *FileStore) Reserve(ctx context.Context, d Draft) (Grant, error) {
	if err := ValidateResource(d.Resource); err != nil {
		return Grant{}, err
	}
	switch d.Mode {
	case "":
		d.Mode = ModeToken
	case ModeToken, ModeHandle:
	default:
		return Grant{}, fmt.Errorf("%w: mode %q", ErrInvalidArgument, d.Mode)
	}
	if err := s.begin(true); err != nil {
		return Grant{}, err
	}
	defer s.mu.Unlock()

	if parent := parentOf(d.Resource); parent != "" {
		if _, ok := s.namespaces[parent]; !ok {
			return Grant{}, fmt.Errorf("%w: %q", ErrNoNamespace, parent)
		}
	}
	if _, ok := s.namespaces[d.Resource]; ok {
		return Grant{}, fmt.Errorf("%w: %q", ErrIsNamespace, d.Resource)
	}
	if e := s.live[d.Resource]; e != nil {
		live, err := s.checkLive(e)
		if err != nil {
			return Grant{}, err
		}
		if live {
			return Grant{}, &LeaseHeldError{Holder: s.snapshot(e)}
		}
	}
	if s.perUID[d.HolderUID] >= s.opts.MaxLeasesPerUID {
		// The count includes leases that died since they were last
		// looked at: end those before refusing (docs/PROTOCOL.md §7 limits live ones).
		if _, err := s.liveLocked(func(e *entry) bool { return e.lease.HolderUID == d.HolderUID }); err != nil {
			return Grant{}, err
		}
		if s.perUID[d.HolderUID] >= s.opts.MaxLeasesPerUID {
			return Grant{}, fmt.Errorf("%w: uid %d holds %d live leases", ErrQuota, d.HolderUID, s.perUID[d.HolderUID])
		}
	}
	now := s.opts.Clock.Now().UTC()
	token := NewToken()
	l := Lease{
		ID:          NewLeaseID(),
		Resource:    d.Resource,
		Status:      StatusActive,
		Mode:        d.Mode,
		Generation:  s.hw + 1,
		HolderUID:   d.HolderUID,
		HolderGID:   d.HolderGID,
		HolderPID:   d.HolderPID,
		Host:        s.opts.Host,
		StartedAt:   now,
		HeartbeatAt: now,
		BootID:      s.bootID,
	}
	if err := applyAnnotations(&l, d.Annotations); err != nil {
		return Grant{}, err
	}
	hash := HashToken(token)
	if err := s.writeRecord(&l, hash); err != nil {
		return Grant{}, err
	}
	s.hw = l.Generation
	e := &entry{lease: l, hash: hash, hbMono: s.opts.Clock.Mono()}
	s.leases[l.ID] = e
	s.addLive(e)
	return Grant{Lease: s.snapshot(e), Token: token}, nil
}

// lookupActive finds lease id and checks that it is live, ending it if it
// is dead. The caller holds mu.
func (s *FileStore) lookupActive(id string) (*entry, error) {
	if err := ValidateLeaseID(id); err != nil {
		return nil, err
	}
	e := s.leases[id]
	if e == nil {
		return nil, fmt.Errorf("%w: lease %s", ErrNotFound, id)
	}
	live, err := s.checkLive(e)
	if err != nil {
		return nil, err
	}
	if !live {
		return nil, fmt.Errorf("%w: lease %s is %s", ErrInactive, id, e.lease.Status)
	}
	return e, nil
}

// mutateActive runs change on live lease id under the store's mutex, after
// checking token when one is given, and returns the resulting lease. change
// must persist before it alters the entry. The caller does not hold mu.
func (s *FileStore) mutateActive(id string, token *string, change func(*entry) error) (Lease, error) {
	if err := s.begin(true); err != nil {
		return Lease{}, err
	}
	defer s.mu.Unlock()
	e, err := s.lookupActive(id)
	if err != nil {
		return Lease{}, err
	}
	if token != nil && !TokenMatches(*token, e.hash) {
		return Lease{}, fmt.Errorf("%w: lease %s", ErrTokenMismatch, id)
	}
	if err := change(e); err != nil {
		return Lease{}, err
	}
	return s.snapshot(e), nil
}

// Renew authenticates token and moves the heartbeat of lease id to now,
// applying ann; see [Store.Renew].
func (s *FileStore) Renew(ctx context.Context, id, token string, ann Annotations) (Lease, error) {
	return s.mutateActive(id, &token, func(e *entry) error {
		l := e.lease
		if err := applyAnnotations(&l, ann); err != nil {
			return err
		}
		l.HeartbeatAt = s.opts.Clock.Now().UTC()
		if err := s.writeRecord(&l, e.hash); err != nil {
			return err
		}
		e.lease, e.hbMono = l, s.opts.Clock.Mono()
		return nil
	})
}

func checkEndStatus(status Status) error {
	if status != StatusComplete && status != StatusAbandoned {
		return fmt.Errorf("%w: end status %q", ErrInvalidArgument, status)
	}
	return nil
}

// Release authenticates token, applies ann and ends lease id with status;
// see [Store.Release].
func (s *FileStore) Release(ctx context.Context, id, token string, status Status, ann Annotations) (Lease, error) {
	if err := checkEndStatus(status); err != nil {
		return Lease{}, err
	}
	return s.mutateActive(id, &token, func(e *entry) error {
		annotated := e.lease
		if err := applyAnnotations(&annotated, ann); err != nil {
			return err
		}
		return s.endLocked(e, annotated, status, "released by its holder", false)
	})
}

// End ends lease id with status without a token; see [Store.End].
func (s *FileStore) End(ctx context.Context, id string, status Status) (Lease, error) {
	if err := checkEndStatus(status); err != nil {
		return Lease{}, err
	}
	return s.mutateActive(id, nil, func(e *entry) error {
		return s.endLocked(e, e.lease, status, "ended by its holder", e.lease.Mode == ModeHandle)
	})
}

// Bind turns live lease id into a handle lease; see [Store.Bind].
func (s *FileStore) Bind(ctx context.Context, id string, holderPID int) (Lease, error) {
	return s.mutateActive(id, nil, func(e *entry) error {
		if e.lease.Mode == ModeHandle {
			return nil
		}
		l := e.lease
		l.Mode = ModeHandle
		if holderPID > 0 {
			l.HolderPID = holderPID
		}
		if err := s.writeRecord(&l, e.hash); err != nil {
			return err
		}
		e.lease = l
		return nil
	})
}

// RequestTakeover records req on live lease id; see [Store.RequestTakeover].
func (s *FileStore) RequestTakeover(ctx context.Context, id string, req TakeoverRequest) (Lease, error) {
	for _, text := range []string{req.By, req.Reason} {
		if err := checkText(text); err != nil {
			return Lease{}, err
		}
	}
	return s.mutateActive(id, nil, func(e *entry) error {
		l := e.lease
		l.TakeoverRequestedBy = req.By
		l.TakeoverRequestedAt = s.opts.Clock.Now().UTC()
		l.TakeoverReason = req.Reason
		if err := s.writeRecord(&l, e.hash); err != nil {
			return err
		}
		e.lease = l
		return nil
	})
}

// Live returns the live lease on resource; see [Store.Live].
func (s *FileStore) Live(ctx context.Context, resource string) (Lease, error) {
	if err := s.begin(false); err != nil {
		return Lease{}, err
	}
	defer s.mu.Unlock()
	e := s.live[resource]
	if e == nil {
		return Lease{}, fmt.Errorf("%w: no live lease on %q", ErrNotFound, resource)
	}
	live, err := s.checkLive(e)
	if err != nil {
		return Lease{}, err
	}
	if !live {
		return Lease{}, fmt.Errorf("%w: no live lease on %q", ErrNotFound, resource)
	}
	return s.snapshot(e), nil
}

// Load returns lease id in any status; see [Store.Load].
func (s *FileStore) Load(ctx context.Context, id string) (Lease, error) {
	if err := ValidateLeaseID(id); err != nil {
		return Lease{}, err
	}
	if err := s.begin(false); err != nil {
		return Lease{}, err
	}
	defer s.mu.Unlock()
	e := s.leases[id]
	if e == nil {
		return Lease{}, fmt.Errorf("%w: lease %s", ErrNotFound, id)
	}
	if _, err := s.checkLive(e); err != nil {
		return Lease{}, err
	}
	return s.snapshot(e), nil
}

// liveLocked returns the live leases accepted by keep, ending (or, read-only,
// skipping) dead ones. The caller holds mu.
func (s *FileStore) liveLocked(keep func(*entry) bool) ([]Lease, error) {
	var out []Lease
	for _, e := range s.live {
		if !keep(e) {
			continue
		}
		live, err := s.checkLive(e)
		if err != nil {
			return nil, err
		}
		if live {
			out = append(out, s.snapshot(e))
		}
	}
	slices.SortFunc(out, func(a, b Lease) int { return strings.Compare(a.Resource, b.Resource) })
	return out, nil
}

// List returns every live lease sorted by resource; see [Store.List].
func (s *FileStore) List(ctx context.Context) ([]Lease, error) {
	if err := s.begin(false); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return s.liveLocked(func(*entry) bool { return true })
}

// ListDir returns the namespaces and live leases directly inside dir; see
// [Store.ListDir].
func (s *FileStore) ListDir(ctx context.Context, dir string) ([]Namespace, []Lease, error) {
	if err := s.begin(false); err != nil {
		return nil, nil, err
	}
	defer s.mu.Unlock()
	if _, ok := s.namespaces[dir]; dir != "" && !ok {
		return nil, nil, fmt.Errorf("%w: %q", ErrNoNamespace, dir)
	}
	var nss []Namespace
	for p, ns := range s.namespaces {
		if p != "" && parentOf(p) == dir {
			nss = append(nss, ns)
		}
	}
	slices.SortFunc(nss, func(a, b Namespace) int { return strings.Compare(a.Path, b.Path) })
	leases, err := s.liveLocked(func(e *entry) bool { return parentOf(e.lease.Resource) == dir })
	return nss, leases, err
}

// History returns ended leases newest first; see [Store.History].
func (s *FileStore) History(ctx context.Context, resource string) ([]Lease, error) {
	if err := s.begin(false); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var out []Lease
	for _, e := range s.leases {
		if e.lease.Status != StatusActive && (resource == "" || e.lease.Resource == resource) {
			out = append(out, s.snapshot(e))
		}
	}
	slices.SortFunc(out, func(a, b Lease) int {
		return cmp.Or(b.CompletedAt.Compare(a.CompletedAt), cmp.Compare(b.Generation, a.Generation))
	})
	return out, nil
}

// EndResource ends every active lease of resource; see [Store.EndResource].
func (s *FileStore) EndResource(ctx context.Context, resource string, status Status) ([]Lease, error) {
	if err := checkEndStatus(status); err != nil {
		return nil, err
	}
	if err := s.begin(true); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var ended []Lease
	for _, e := range s.leases {
		if e.lease.Resource == resource && e.lease.Status == StatusActive {
			if err := s.endLocked(e, e.lease, status, "resource ended", false); err != nil {
				return ended, err
			}
			ended = append(ended, s.snapshot(e))
		}
	}
	return ended, nil
}

// Reap ends every dead lease as abandoned and returns them, then prunes
// history beyond Options.HistoryKeep; see [Store.Reap].
func (s *FileStore) Reap(ctx context.Context) ([]Lease, error) {
	if err := s.begin(true); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if err := s.syncLocked(); err != nil {
		s.opts.Logger.Warn("records of ended leases still cannot be written", "count", len(s.unsynced), "err", err)
	}
	var ended []Lease
	for _, e := range s.live {
		live, err := s.checkLive(e)
		if err != nil {
			return ended, err
		}
		if !live {
			ended = append(ended, s.snapshot(e))
		}
	}
	return ended, s.pruneLocked()
}

// pruneLocked removes the oldest ended records beyond HistoryKeep, after
// persisting the generation high-water mark so that no generation is ever
// granted twice (docs/PROTOCOL.md §1). The caller holds mu.
func (s *FileStore) pruneLocked() error {
	var ended []*entry
	for _, e := range s.leases {
		if e.lease.Status != StatusActive {
			ended = append(ended, e)
		}
	}
	excess := len(ended) - s.opts.HistoryKeep
	if excess <= 0 {
		return nil
	}
	if err := s.saveGeneration(); err != nil {
		return err
	}
	slices.SortFunc(ended, func(a, b *entry) int {
		return cmp.Or(a.lease.CompletedAt.Compare(b.lease.CompletedAt), cmp.Compare(a.lease.Generation, b.lease.Generation))
	})
	unlock, err := s.flock(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	for _, e := range ended[:excess] {
		path := filepath.Join(s.dir, e.lease.ID+".toml")
		if err := removeFile(path); err != nil {
			return err
		}
		delete(s.leases, e.lease.ID)
		delete(s.unsynced, e.lease.ID)
	}
	if err := s.dirFile.Sync(); err != nil {
		return &PersistError{Op: "sync", Path: s.dir, Err: err}
	}
	return nil
}

// saveGeneration persists the generation high-water mark. The caller holds mu.
func (s *FileStore) saveGeneration() error {
	if s.hwSaved >= s.hw {
		return nil
	}
	data := []byte(strconv.FormatUint(s.hw, 10) + "\n")
	if err := writeFile(s.stFile, filepath.Join(s.state, generationName), data); err != nil {
		return err
	}
	s.hwSaved = s.hw
	return nil
}

// AddWaiters adds delta to the count of blocked flock waiters on resource;
// see [Store.AddWaiters]. The count lives in memory and, for "leasefs ls"
// and "status", in the waiters file of the state directory, rewritten
// without fsync: it describes blocked calls of this daemon, which do not
// outlive it.
func (s *FileStore) AddWaiters(resource string, delta int) {
	if err := s.begin(true); err != nil {
		return
	}
	defer s.mu.Unlock()
	n := s.waiters[resource] + delta
	if n <= 0 {
		delete(s.waiters, resource)
	} else {
		s.waiters[resource] = n
	}
	s.saveWaiters()
}
