package etcdstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefs/leasefs/leasecore"
)

// Namespace returns the namespace at path; see [leasecore.Store.Namespace].
// A namespace this store has learned is answered with no round trip, until
// its watch shows it removed (docs/PROTOCOL.md §8a, "Namespaces"); any
// other costs one read.
func (s *Store) Namespace(ctx context.Context, path string) (leasecore.Namespace, error) {
	if err := s.begin(false); err != nil {
		return leasecore.Namespace{}, err
	}
	if ns, ok := s.cachedNS(path); ok {
		return ns, nil
	}
	cctx, done := s.call(ctx)
	resp, err := s.cli.Get(cctx, s.k.ns(path))
	done()
	if err != nil {
		return leasecore.Namespace{}, s.unreachable(ctx, "read", s.k.ns(path), err, false)
	}
	if path == "" || len(resp.Kvs) == 0 {
		return leasecore.Namespace{}, fmt.Errorf("%w: namespace %q", leasecore.ErrNotFound, path)
	}
	ns := decodeNS(path, resp.Kvs[0].Value)
	s.mu.Lock()
	s.learnNS(ns, resp.Header.Revision)
	s.mu.Unlock()
	return ns, nil
}

// Mkdir creates namespace path; see [leasecore.Store.Mkdir]. A uid may own
// at most MaxLeasesPerUID namespaces (ErrQuota).
func (s *Store) Mkdir(ctx context.Context, path string, uid, gid uint32) (leasecore.Namespace, error) {
	if err := leasecore.ValidateResource(path); err != nil {
		return leasecore.Namespace{}, err
	}
	if err := s.begin(true); err != nil {
		return leasecore.Namespace{}, err
	}
	parent := leasecore.ParentOf(path)
	for range maxRetries {
		ops := []clientv3.Op{
			clientv3.OpGet(s.k.ns(path), clientv3.WithCountOnly()),
			clientv3.OpGet(s.k.live(path)),
			clientv3.OpGet(s.k.nsOwners(uid), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		}
		if parent != "" {
			ops = append(ops, clientv3.OpGet(s.k.ns(parent), clientv3.WithCountOnly()))
		}
		cctx, done := s.call(ctx)
		resp, err := s.readTxn(cctx, ops...)
		done()
		if err != nil {
			return leasecore.Namespace{}, s.unreachable(ctx, "read", s.k.ns(path), err, false)
		}
		rs := resp.Responses
		switch {
		case parent != "" && rs[3].GetResponseRange().Count == 0:
			return leasecore.Namespace{}, fmt.Errorf("%w: %q", leasecore.ErrNoNamespace, parent)
		case rs[0].GetResponseRange().Count > 0:
			return leasecore.Namespace{}, fmt.Errorf("%w: namespace %q", leasecore.ErrExists, path)
		case rs[2].GetResponseRange().Count >= int64(s.opts.MaxLeasesPerUID):
			return leasecore.Namespace{}, fmt.Errorf("%w: uid %d owns %d namespaces", leasecore.ErrQuota, uid, rs[2].GetResponseRange().Count)
		}
		if kvs := rs[1].GetResponseRange().Kvs; len(kvs) > 0 {
			r, err := s.decode(kvs[0], true)
			if err != nil {
				return leasecore.Namespace{}, fmt.Errorf("%w: %q is a lease", leasecore.ErrExists, path)
			}
			s.mu.Lock()
			dead := s.deadReason(r)
			s.mu.Unlock()
			if dead == "" {
				return leasecore.Namespace{}, fmt.Errorf("%w: %q is a live lease", leasecore.ErrExists, path)
			}
			if _, err := s.end(ctx, r, r.l, leasecore.StatusAbandoned, chExpired); err != nil && !errors.Is(err, errRaced) {
				return leasecore.Namespace{}, err
			}
			continue
		}
		ns := leasecore.Namespace{Path: path, UID: uid, GID: gid, CreatedAt: s.opts.Clock.Now().UTC().Truncate(time.Millisecond)}
		v, _ := json.Marshal(nsValue{UID: uid, GID: gid, CreatedAt: ns.CreatedAt})
		conds := []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(s.k.ns(path)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(s.k.live(path)), "=", 0),
			clientv3.Compare(clientv3.ModRevision(s.k.nsOwners(uid)), "<", resp.Header.Revision+1).WithPrefix(),
		}
		if parent != "" {
			conds = append(conds, clientv3.Compare(clientv3.CreateRevision(s.k.ns(parent)), ">", 0))
		}
		cctx, done = s.call(ctx)
		start := time.Now()
		tresp, err := s.cli.Txn(cctx).If(conds...).Then(
			clientv3.OpPut(s.k.ns(path), string(v)),
			clientv3.OpPut(s.k.nsOwner(uid, path), ""),
		).Commit()
		done()
		if err != nil {
			return leasecore.Namespace{}, s.unreachable(ctx, "mkdir", s.k.ns(path), err, true)
		}
		if tresp.Succeeded {
			s.committed(start)
			s.mu.Lock()
			s.learnNS(ns, tresp.Header.Revision)
			s.mu.Unlock()
			return ns, nil
		}
	}
	return leasecore.Namespace{}, s.tooBusy(s.k.ns(path))
}

// Rmdir removes an empty namespace; see [leasecore.Store.Rmdir]. The
// transaction succeeds only while no live lease and no namespace is under
// path.
func (s *Store) Rmdir(ctx context.Context, path string) error {
	if err := s.begin(true); err != nil {
		return err
	}
	if path == "" {
		return fmt.Errorf("%w: namespace %q", leasecore.ErrNotFound, path)
	}
	for range maxRetries {
		cctx, done := s.call(ctx)
		resp, err := s.readTxn(cctx,
			clientv3.OpGet(s.k.ns(path)),
			clientv3.OpGet(s.k.nsPrefix(path), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
			clientv3.OpGet(s.k.livePrefix(path), clientv3.WithPrefix()),
		)
		done()
		if err != nil {
			return s.unreachable(ctx, "read", s.k.ns(path), err, false)
		}
		rs := resp.Responses
		nsKVs := rs[0].GetResponseRange().Kvs
		if len(nsKVs) == 0 {
			return fmt.Errorf("%w: namespace %q", leasecore.ErrNotFound, path)
		}
		if kvs := rs[1].GetResponseRange().Kvs; len(kvs) > 0 {
			return fmt.Errorf("%w: %q holds namespace %q", leasecore.ErrNotEmpty, path, strings.TrimPrefix(string(kvs[0].Key), s.k.ns("")))
		}
		ended := false
		for _, kv := range rs[2].GetResponseRange().Kvs {
			r, err := s.decode(kv, true)
			if err != nil {
				continue
			}
			s.mu.Lock()
			dead := s.deadReason(r)
			s.mu.Unlock()
			if dead == "" {
				return fmt.Errorf("%w: %q holds live lease %q", leasecore.ErrNotEmpty, path, r.l.Resource)
			}
			if _, err := s.end(ctx, r, r.l, leasecore.StatusAbandoned, chExpired); err != nil && !errors.Is(err, errRaced) {
				return err
			}
			ended = true
		}
		if ended {
			continue
		}
		owner := decodeNS(path, nsKVs[0].Value).UID
		cctx, done = s.call(ctx)
		start := time.Now()
		tresp, err := s.cli.Txn(cctx).If(
			clientv3.Compare(clientv3.ModRevision(s.k.ns(path)), "=", nsKVs[0].ModRevision),
			clientv3.Compare(clientv3.CreateRevision(s.k.nsPrefix(path)), "=", 0).WithPrefix(),
			clientv3.Compare(clientv3.CreateRevision(s.k.livePrefix(path)), "=", 0).WithPrefix(),
		).Then(clientv3.OpDelete(s.k.ns(path)), clientv3.OpDelete(s.k.nsOwner(owner, path))).Commit()
		done()
		if err != nil {
			return s.unreachable(ctx, "rmdir", s.k.ns(path), err, true)
		}
		if tresp.Succeeded {
			s.committed(start)
			s.mu.Lock()
			s.nsRemoved(path, tresp.Header.Revision)
			s.mu.Unlock()
			return nil
		}
	}
	return s.tooBusy(s.k.ns(path))
}

// maxNSGone bounds the removals a store remembers (see Store.nsGone);
// past it they are forgotten at once and older answers are not learned.
const maxNSGone = 4096

// cachedNS returns namespace path as this store has learned it, if it has.
func (s *Store) cachedNS(path string) (leasecore.Namespace, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ns, ok := s.nss[path]
	return ns, ok
}

// learnNS records namespace ns, which a call answered at revision at read
// or wrote, unless the watch has shown it removed after at. The caller
// holds mu.
func (s *Store) learnNS(ns leasecore.Namespace, at int64) {
	if ns.Path == "" || at < s.nsFloor || s.nsGone[ns.Path] > at {
		return
	}
	s.nss[ns.Path] = ns
}

// nsRemoved forgets namespace path, removed at revision rev. The caller
// holds mu.
func (s *Store) nsRemoved(path string, rev int64) {
	delete(s.nss, path)
	if len(s.nsGone) >= maxNSGone {
		clear(s.nsGone)
		s.nsFloor = rev
	}
	s.nsGone[path] = max(s.nsGone[path], rev)
}

// forgetNamespaces drops every namespace learned, for a watch that missed
// changes (etcd compacted past it). The caller holds mu.
func (s *Store) forgetNamespaces(rev int64) {
	clear(s.nss)
	clear(s.nsGone)
	s.nsFloor = rev
}
