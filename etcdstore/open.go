package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/leasecore"
)

// Open connects to the cluster at endpoints ("HOST:PORT") and serves the
// leases under prefix (a "/" is appended when missing; "" is refused). It
// reads the live leases, ends the handle leases this daemon (Host and
// DaemonID) left when it last stopped, and starts the watch and the
// reaper. Errors: the cluster cannot be reached within opts.CallTimeout;
// an invalid prefix.
func Open(ctx context.Context, endpoints []string, prefix string, opts Options) (*Store, error) {
	if prefix == "" || len(endpoints) == 0 {
		return nil, errors.New("etcdstore: endpoints and a key prefix are required")
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	opts.Options = opts.Options.WithDefaults()
	if opts.DaemonID == "" {
		opts.DaemonID = opts.Host
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.SessionTTL <= 0 {
		opts.SessionTTL = DefaultSessionTTL
	}
	opts.Grace = max(opts.Grace, 0)
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: opts.CallTimeout,
		// Detect a dead connection within about a call timeout.
		DialKeepAliveTime:    opts.CallTimeout,
		DialKeepAliveTimeout: opts.CallTimeout,
		TLS:                  opts.TLS,
		Username:             opts.Username,
		Password:             opts.Password,
		Logger:               zap.NewNop(),
		Context:              context.Background(),
		DialOptions:          opts.DialOptions,
	})
	if err != nil {
		return nil, fmt.Errorf("etcdstore: connect to %s: %w", strings.Join(endpoints, ","), err)
	}
	bg, cancel := context.WithCancel(context.Background())
	s := &Store{
		cli: cli, opts: opts, k: keys(prefix), bootID: procfs.BootID(),
		ttl: int64((opts.LeaseDuration + opts.Grace + time.Second - 1) / time.Second),
		bg:  bg, cancel: cancel, kick: make(chan struct{}, 1),
		known: make(map[string]*known), live: make(map[string]*rec),
		handles: make(map[string]*handle), previous: make(map[string]string),
		bucketKick:  make(chan struct{}, 1),
		quotaFullAt: make(map[uint32]time.Time), follows: make(map[string]*follow), mine: make(map[clientv3.LeaseID]time.Time),
		queue: make(map[string]map[string]int64), pinned: make(map[string]int),
		writing: make(map[string]int), writeIdle: make(map[string]chan struct{}), own: make(map[string][]int64),
		nss: make(map[string]leasecore.Namespace), nsGone: make(map[string]int64),
		changed: make(map[string]chan struct{}),
		health:  leasecore.Health{Reachable: true},
	}
	if err := s.start(ctx); err != nil {
		cancel()
		cli.Close()
		return nil, err
	}
	return s, nil
}

// start finds the handle leases this daemon's predecessor left (the live
// keys on the handle session its daemon key names, see [keys]), grants
// the handle session, keeps those a process still holds and ends the
// others, grants the session lease of waiter keys and starts the watch of
// namespaces, the reaper and the keep-alives. It reads what this daemon
// needs, not the prefix: the names it follows come later, one by one
// (follow.go).
func (s *Store) start(ctx context.Context) error {
	dkey := s.k.daemon(s.opts.Host, s.opts.DaemonID)
	cctx, done := s.call(ctx)
	resp, err := s.cli.Get(cctx, dkey, clientv3.WithPrefix())
	done()
	if err != nil {
		return s.openError(ctx, err)
	}
	s.rev = resp.Header.Revision
	var stale []*rec
	for _, kv := range resp.Kvs {
		name := strings.TrimPrefix(string(kv.Key), dkey)
		bucket, isBucket := strings.CutPrefix(name, "bucket/")
		text := string(kv.Value)
		if isBucket {
			text = bucket
		} else if name != "session" {
			continue
		}
		id, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			continue
		}
		leases, err := s.leasesOn(ctx, clientv3.LeaseID(id), isBucket)
		if err != nil {
			return s.openError(ctx, err)
		}
		for _, r := range leases {
			if r.l.Mode == leasecore.ModeHandle && r.l.Host == s.opts.Host && r.daemon == s.opts.DaemonID {
				stale = append(stale, r)
			}
		}
	}
	if s.opts.ReadOnly {
		// A reader only shows what the daemon keeps (§2): it changes
		// nothing in the cluster.
		for _, r := range stale {
			if pids := s.holders(r.l); len(pids) > 0 {
				s.previous[r.l.ID] = leasecore.FormatPIDs(pids)
			}
		}
		from := s.rev
		s.wg.Go(func() { s.watchNamespaces(from) })
		s.wg.Go(s.sweeper)
		return nil
	}
	if err := s.grantHandleSession(ctx); err != nil {
		return fmt.Errorf("etcdstore: grant the handle session: %w", err)
	}
	for _, r := range stale {
		// A handle lease lives while its open file does, whoever serves
		// it (docs/PROTOCOL.md §2): one still held is kept alive again,
		// the others are ended.
		reason := "handle lease of a previous daemon"
		if pids := s.holders(r.l); len(pids) > 0 {
			kept, err := s.resumeKeepAlive(ctx, r)
			if err != nil {
				return err
			}
			if kept {
				s.mu.Lock()
				if h := s.handles[r.l.ID]; h != nil {
					h.previous = leasecore.FormatPIDs(pids)
				}
				s.mu.Unlock()
				continue
			}
			reason = "its etcd lease expired while no daemon kept it alive"
		}
		if _, err := s.end(ctx, r, r.l, leasecore.StatusAbandoned, chExpired); err != nil && !errors.Is(err, errRaced) {
			return err
		}
		s.opts.Logger.Info("lease ended", "resource", r.l.Resource, "lease", r.l.ID,
			"status", leasecore.StatusAbandoned, "reason", reason)
	}
	ka, err := s.grantSession(ctx)
	if err != nil {
		return err
	}
	from := s.rev // before any goroutine can change it
	s.wg.Go(func() { s.keepSession(ka) })
	s.wg.Go(s.keepHandles)
	s.wg.Go(s.keepBuckets)
	s.wg.Go(s.reaper)
	s.wg.Go(s.sweeper)
	s.wg.Go(func() { s.watchNamespaces(from) })
	return nil
}

// leasesOn returns the leases on etcd lease lid, a previous daemon's of
// this identity (its handle session, or a token lease bucket when bucket),
// and follows their names as this daemon's own: the live keys attached to
// lid, read with their waiter keys. A bucket becomes one of this daemon's
// (see [Store.owns]) until it expires, so that the expiry of the leases
// on it is recorded.
func (s *Store) leasesOn(ctx context.Context, lid clientv3.LeaseID, bucket bool) ([]*rec, error) {
	cctx, done := s.call(ctx)
	ttl, err := s.cli.TimeToLive(cctx, lid, clientv3.WithAttachedKeys())
	done()
	if err != nil {
		if isLeaseGone(err) {
			return nil, nil
		}
		return nil, err
	}
	if ttl.TTL <= 0 {
		return nil, nil
	}
	if bucket {
		s.mu.Lock()
		s.mine[lid] = time.Now().Add(time.Duration(ttl.TTL) * time.Second)
		s.mu.Unlock()
	}
	var names []string
	for _, k := range ttl.Keys {
		if kind, resource := s.k.classify(string(k)); kind == "live" {
			names = append(names, resource)
		}
	}
	var stale []*rec
	for len(names) > 0 {
		batch := names[:min(len(names), 60)] // two operations each; etcd's default limit is 128 a transaction
		names = names[len(batch):]
		ops := make([]clientv3.Op, 0, 2*len(batch))
		for _, resource := range batch {
			ops = append(ops, clientv3.OpGet(s.k.live(resource)),
				s.waiterKeys(resource))
		}
		cctx, done := s.call(ctx)
		resp, err := s.readTxn(cctx, ops...)
		done()
		if err != nil {
			return nil, err
		}
		for i, resource := range batch {
			kvs := resp.Responses[2*i].GetResponseRange().Kvs
			if len(kvs) == 0 {
				continue
			}
			r, err := s.decode(kvs[0], true)
			if err != nil {
				s.opts.Logger.Warn("ignoring a malformed lease key", "key", string(kvs[0].Key), "err", err)
				continue
			}
			s.mu.Lock()
			s.observe(resource, resp.Header.Revision, r, resp.Responses[2*i+1].GetResponseRange().Kvs)
			s.mu.Unlock()
			stale = append(stale, r)
		}
	}
	return stale, nil
}

// openError explains the first call of Open that failed: which endpoints
// did not answer within how long, and what to check.
func (s *Store) openError(ctx context.Context, err error) error {
	eps := strings.Join(s.cli.Endpoints(), ",")
	if ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded || status.Code(err) == codes.Unavailable) {
		return fmt.Errorf("etcdstore: no etcd member at %s answered within %s (%w): check that etcd runs there "+
			"and listens on those client URLs, and the TLS and credential flags", eps, s.opts.CallTimeout, err)
	}
	return fmt.Errorf("etcdstore: read the live leases under %s from %s: %w", s.k, eps, err)
}

// holders returns the processes that still hold the open file of handle
// lease l ([leasecore.Options.HandleHolders]).
func (s *Store) holders(l leasecore.Lease) []int {
	if s.opts.HandleHolders == nil {
		return nil
	}
	return s.opts.HandleHolders(l)
}

// resumeKeepAlive keeps alive again handle lease r, left by a previous
// daemon of this identity whose open file a process still holds
// (docs/PROTOCOL.md §2, §8a), and reports whether the cluster still had
// its etcd lease: a daemon back within the TTL of the last keep-alive
// keeps the lease, one away longer finds it expired. A lease kept is moved
// to this store's handle session in one transaction; the old etcd lease
// then expires on its own.
func (s *Store) resumeKeepAlive(ctx context.Context, r *rec) (bool, error) {
	lid := clientv3.LeaseID(r.kv.Lease)
	if lid == 0 {
		return false, nil
	}
	cctx, done := s.call(ctx)
	resp, err := s.cli.KeepAliveOnce(cctx, lid)
	done()
	if err != nil || resp.TTL <= 0 {
		return false, nil
	}
	session, err := s.handleSession()
	if err != nil {
		return false, err
	}
	if _, err := s.put(ctx, r, r.l, r.change, session); err != nil {
		if errors.Is(err, errRaced) || errors.Is(err, leasecore.ErrInactive) {
			return false, nil
		}
		return false, err
	}
	s.keepAlive(r.l.ID)
	s.opts.Logger.Info("handle lease kept", "resource", r.l.Resource, "lease", r.l.ID,
		"generation", r.l.Generation, "reason", "a process still holds the open file it was locked on")
	return true, nil
}

// grantSession grants a new session lease for waiter keys and starts its
// keep-alive.
func (s *Store) grantSession(ctx context.Context) (<-chan *clientv3.LeaseKeepAliveResponse, error) {
	cctx, done := s.call(ctx)
	g, err := s.cli.Grant(cctx, int64((s.opts.SessionTTL+time.Second-1)/time.Second))
	done()
	if err != nil {
		return nil, fmt.Errorf("etcdstore: grant the session lease: %w", err)
	}
	ka, err := s.cli.KeepAlive(s.bg, g.ID)
	if err != nil {
		return nil, fmt.Errorf("etcdstore: keep the session lease alive: %w", err)
	}
	s.mu.Lock()
	s.session = g.ID
	s.mu.Unlock()
	return ka, nil
}

// keepSession drains the session's keep-alive until the store closes;
// when the session is lost (the cluster was unreachable past its TTL, and
// with it this store's waiter keys), it grants a new one, retrying each
// second. Blocked Acquires find their waiter key gone and queue again.
func (s *Store) keepSession(ka <-chan *clientv3.LeaseKeepAliveResponse) {
	for {
		for range ka {
		}
		for {
			s.mu.Lock()
			closing := s.closing
			s.mu.Unlock()
			if closing || s.bg.Err() != nil {
				return
			}
			var err error
			if ka, err = s.grantSession(s.bg); err == nil {
				s.opts.Logger.Warn("the etcd session of waiter keys was lost and granted again")
				break
			}
			select {
			case <-s.bg.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// sessionID returns the current session lease.
func (s *Store) sessionID() clientv3.LeaseID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.session
}
