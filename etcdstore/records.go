package etcdstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/leasefs/leasefs/leasecore"
)

// encode renders a lease key's value: the record and this store's extra
// keys.
func (s *Store) encode(l leasecore.Lease, hash, change string, d time.Duration) string {
	l.ExpiresAt, l.Waiters = time.Time{}, 0
	var b strings.Builder
	b.Write(leasecore.EncodeRecord(&l, hash))
	b.WriteString("leasefs_change = " + leasecore.QuoteTOML(change) + "\n")
	b.WriteString("leasefs_daemon = " + leasecore.QuoteTOML(s.opts.DaemonID) + "\n")
	if d > 0 {
		b.WriteString("leasefs_lease_duration = " + leasecore.QuoteTOML(d.String()) + "\n")
	}
	return b.String()
}

// durationOf returns the lease duration of r: the one its reserving
// daemon recorded (every mount of a cluster may run with its own
// --lease-duration), else this store's.
func (s *Store) durationOf(r *rec) time.Duration {
	if r.duration > 0 {
		return r.duration
	}
	return s.opts.LeaseDuration
}

// decode parses a lease key; a live key takes its generation from its
// create revision.
func (s *Store) decode(kv *mvccpb.KeyValue, live bool) (*rec, error) {
	// The value is the record in the canonical form of leasecore's
	// encoder followed by this store's extra keys, each on a line of its
	// own (see [Store.encode]): the record decodes on leasecore's fast path
	// and the extra keys by their lines, without a general TOML parse;
	// any other value takes the general decoder.
	record, extras := kv.Value, []byte(nil)
	if i := bytes.Index(kv.Value, []byte("\nleasefs_")); i >= 0 {
		record, extras = kv.Value[:i+1], kv.Value[i+1:]
	}
	l, hash, err := leasecore.DecodeRecord(record)
	lines := err == nil // the extra keys follow the record, as encode writes them
	if !lines && len(record) < len(kv.Value) {
		// Keys in another order: the whole value is the record.
		l, hash, err = leasecore.DecodeRecord(kv.Value)
	}
	if err != nil {
		return nil, err
	}
	if live {
		// The generation is the revision of the reservation, known only
		// once it committed: the live record carries 0.
		l.Generation = uint64(kv.CreateRevision)
	}
	r := &rec{l: l, hash: hash, kv: kv}
	if !lines || !r.extraLines(extras) {
		s.decodeExtra(r)
	}
	return r, nil
}

// extraLines reads this store's extra keys from lines of the form
// `leasefs_KEY = "VALUE"` as [Store.encode] writes them, and reports
// whether every line was one; false leaves r to the general decoder.
func (r *rec) extraLines(lines []byte) bool {
	var change, daemon, duration string
	for rest := lines; len(rest) > 0; {
		nl := bytes.IndexByte(rest, '\n')
		if nl < 0 {
			return false
		}
		line := rest[:nl]
		rest = rest[nl+1:]
		key, val, ok := bytes.Cut(line, []byte(" = "))
		if !ok {
			return false
		}
		text, ok := leasecore.CanonicalString(val)
		if !ok {
			return false
		}
		switch string(key) {
		case "leasefs_change":
			change = text
		case "leasefs_daemon":
			daemon = text
		case "leasefs_lease_duration":
			duration = text
		default:
			return false
		}
	}
	r.change, r.daemon = change, daemon
	if d, err := time.ParseDuration(duration); err == nil && d > 0 {
		r.duration = d
	}
	return true
}

func (s *Store) decodeExtra(r *rec) {
	var x extra
	if _, err := toml.Decode(string(r.kv.Value), &x); err == nil {
		r.change, r.daemon = x.Change, x.Daemon
		if d, err := time.ParseDuration(x.Duration); err == nil && d > 0 {
			r.duration = d
		}
	}
}

// learnLive records r, which a call answered at revision at read or
// wrote, as the live lease of its resource ([Store.setLive]), if the store
// follows the name and its watch has not already shown a change after at:
// the watch's view then holds r or what followed it, and r, whose end the
// watch may already have applied, would bring back a lease that is gone,
// in the way of every waiter of the name for as long as the daemon runs.
// A name the store does not follow is not recorded: no watch would keep
// it fresh (see [Store.observe]). The caller holds mu.
func (s *Store) learnLive(r *rec, at int64) {
	f := s.follows[r.l.Resource]
	if f == nil || f.liveSeen > at {
		return
	}
	f.touched = time.Now()
	s.setLive(r)
}

// fresher returns what a read should show for r, which a call answered
// at revision at: r itself unless the store follows the name and its
// watch has shown a change after at; else the view's record of the same
// lease, or nil when the view no longer holds it (it ended after the
// read, as the watch has shown). A record the view has let go must not be
// judged again: its heartbeat would count as first seen now
// (docs/PROTOCOL.md §5 rule 1, on this store's clock), and an expired
// lease would show live. The caller holds mu.
func (s *Store) fresher(r *rec, at int64) *rec {
	if f := s.follows[r.l.Resource]; f == nil || f.liveSeen <= at {
		return r
	}
	if cur := s.live[r.l.Resource]; cur != nil && cur.l.ID == r.l.ID {
		return cur
	}
	return nil
}

// setLive records r as the live lease of its resource, unless this store
// already knows a later version of that key (by mod revision), and
// remembers it. Its own transactions, its reads and its watch all feed it,
// so that a read through an open descriptor can answer from what the
// daemon has learned (docs/PROTOCOL.md §3, §8a). The caller holds mu.
func (s *Store) setLive(r *rec) {
	if cur := s.live[r.l.Resource]; cur != nil && cur.kv.ModRevision > r.kv.ModRevision {
		return
	}
	s.live[r.l.Resource] = r
	s.remember(r)
}

// dropLive forgets the live lease of resource that a delete at revision
// rev removed, unless this store knows a later version of the key. The
// caller holds mu.
func (s *Store) dropLive(resource string, rev int64) {
	if cur := s.live[resource]; cur != nil && cur.kv.ModRevision < rev {
		delete(s.live, resource)
	}
}

// remember records what the store saw of a live lease.
func (s *Store) remember(r *rec) {
	k := s.known[r.l.ID]
	if k == nil {
		k = &known{resource: r.l.Resource}
		s.known[r.l.ID] = k
	}
	k.last = r.l
	if !k.hb.Equal(r.l.HeartbeatAt) {
		k.hb, k.hbMono = r.l.HeartbeatAt, s.opts.Clock.Mono()
	}
}

// deadReason applies the liveness rules to a live lease: a handle lease
// this store keeps alive ends at its local deadline ([Store.keepAlive]);
// rule 1 on this
// store's monotonic clock from when it first saw the current heartbeat
// (the etcd lease TTL, which the cluster enforces, fires no later up to
// clock drift: see docs/PROTOCOL.md §8a), and rules 2 and 3 only for
// leases recorded by this host. The caller holds mu.
func (s *Store) deadReason(r *rec) string {
	k := s.known[r.l.ID]
	if k != nil || s.follows[r.l.Resource] != nil {
		s.remember(r)
		k = s.known[r.l.ID]
	} else {
		// A lease of a name the store does not follow (a listing): judged
		// as first seen now, and not remembered.
		k = &known{resource: r.l.Resource, last: r.l, hb: r.l.HeartbeatAt, hbMono: s.opts.Clock.Mono()}
	}
	switch {
	case k.lost:
		return "keep-alive lost"
	case s.handles[r.l.ID] != nil && !time.Now().Before(s.hs.deadline):
		return "keep-alive not confirmed before the local deadline"
	case r.l.Mode == leasecore.ModeToken && s.opts.Clock.Mono()-k.hbMono >= s.durationOf(r):
		return "heartbeat expired"
	case r.l.Host != s.opts.Host:
		return ""
	}
	return leasecore.LocalDeadReason(r.l, s.bootID)
}

// snapshot returns the lease of r as callers see it: derived expiry and
// waiters filled, and a dead lease shown as it will be recorded,
// abandoned. The caller holds mu.
func (s *Store) snapshot(r *rec, waiters int64) leasecore.Lease {
	l := r.l
	if l.Status == leasecore.StatusActive && s.deadReason(r) != "" {
		s.wakeReaper()
		l.Status = leasecore.StatusAbandoned
		l.CompletedAt = s.opts.Clock.Now().UTC()
		return l
	}
	s.fill(&l, s.durationOf(r))
	if l.Status == leasecore.StatusActive {
		l.Waiters = int(waiters)
		if h := s.handles[l.ID]; h != nil {
			l.KeepAliveUntil = s.hs.deadline.UTC().Truncate(time.Millisecond)
			if h.previous != "" {
				l.Daemon, l.HolderPIDs = leasecore.DaemonPrevious, h.previous
			}
		} else if pids := s.previous[l.ID]; pids != "" {
			l.Daemon, l.HolderPIDs = leasecore.DaemonPrevious, pids
		}
	}
	return l
}

// fill sets ExpiresAt from the heartbeat, the mode and the lease's
// duration d.
func (s *Store) fill(l *leasecore.Lease, d time.Duration) {
	l.ExpiresAt = time.Time{}
	if l.Mode == leasecore.ModeToken && l.Status == leasecore.StatusActive {
		l.ExpiresAt = l.HeartbeatAt.Add(d)
	}
}

// nsValue is the value of a namespace key.
type nsValue struct {
	UID       uint32    `json:"uid"`
	GID       uint32    `json:"gid"`
	CreatedAt time.Time `json:"created_at"`
}

func decodeNS(path string, v []byte) leasecore.Namespace {
	var n nsValue
	_ = json.Unmarshal(v, &n)
	return leasecore.Namespace{Path: path, UID: n.UID, GID: n.GID, CreatedAt: n.CreatedAt.UTC()}
}

// isLeaseGone reports whether err says the etcd lease no longer exists.
func isLeaseGone(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || strings.Contains(err.Error(), rpctypes.ErrLeaseNotFound.Error())
}

func uidString(uid uint32) string { return strconv.FormatUint(uint64(uid), 10) }
