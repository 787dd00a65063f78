package engine

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/leasefs/leasefs/leasecore"
)

// Namespace returns the namespace at path; see [leasecore.Store.Namespace].
func (s *Engine) Namespace(ctx context.Context, path string) (_ leasecore.Namespace, err error) {
	if err := s.begin(false); err != nil {
		return leasecore.Namespace{}, err
	}
	defer s.unlock(&err)
	ns, ok := s.namespaces[path]
	if !ok {
		return leasecore.Namespace{}, fmt.Errorf("%w: namespace %q", leasecore.ErrNotFound, path)
	}
	return ns, nil
}

// Mkdir creates namespace path; see [leasecore.Store.Mkdir]. A uid may own at most
// Options.MaxLeasesPerUID namespaces (ErrQuota), so that one user cannot
// exhaust the store (docs/PROTOCOL.md §7).
func (s *Engine) Mkdir(ctx context.Context, path string, uid, gid uint32) (_ leasecore.Namespace, err error) {
	if err := leasecore.ValidateResource(path); err != nil {
		return leasecore.Namespace{}, err
	}
	if err := s.begin(true); err != nil {
		return leasecore.Namespace{}, err
	}
	defer s.unlock(&err)
	if p := leasecore.ParentOf(path); p != "" {
		if _, ok := s.namespaces[p]; !ok {
			return leasecore.Namespace{}, fmt.Errorf("%w: %q", leasecore.ErrNoNamespace, p)
		}
	}
	if _, ok := s.namespaces[path]; ok {
		return leasecore.Namespace{}, fmt.Errorf("%w: namespace %q", leasecore.ErrExists, path)
	}
	owned := 0
	for _, ns := range s.namespaces {
		if ns.UID == uid {
			owned++
		}
	}
	if owned >= s.opts.MaxLeasesPerUID {
		return leasecore.Namespace{}, fmt.Errorf("%w: uid %d owns %d namespaces", leasecore.ErrQuota, uid, owned)
	}
	if e := s.live[path]; e != nil {
		if live, err := s.checkLive(e); err != nil {
			return leasecore.Namespace{}, err
		} else if live {
			return leasecore.Namespace{}, fmt.Errorf("%w: %q is a live lease", leasecore.ErrExists, path)
		}
	}
	ns := leasecore.Namespace{Path: path, UID: uid, GID: gid, CreatedAt: s.opts.Clock.Now().UTC().Truncate(time.Millisecond)}
	next := maps.Clone(s.namespaces)
	next[path] = ns
	if err := s.persist.SaveNamespaces(next); err != nil {
		return leasecore.Namespace{}, err
	}
	s.namespaces = next
	return ns, nil
}

// Rmdir removes an empty namespace; see [leasecore.Store.Rmdir].
func (s *Engine) Rmdir(ctx context.Context, path string) (err error) {
	if err := s.begin(true); err != nil {
		return err
	}
	defer s.unlock(&err)
	if _, ok := s.namespaces[path]; !ok {
		return fmt.Errorf("%w: namespace %q", leasecore.ErrNotFound, path)
	}
	prefix := path + "/"
	for p := range s.namespaces {
		if strings.HasPrefix(p, prefix) {
			return fmt.Errorf("%w: %q holds namespace %q", leasecore.ErrNotEmpty, path, p)
		}
	}
	for r, e := range s.live {
		if !strings.HasPrefix(r, prefix) {
			continue
		}
		live, err := s.checkLive(e)
		if err != nil {
			return err
		}
		if live {
			return fmt.Errorf("%w: %q holds live lease %q", leasecore.ErrNotEmpty, path, r)
		}
	}
	next := maps.Clone(s.namespaces)
	delete(next, path)
	if err := s.persist.SaveNamespaces(next); err != nil {
		return err
	}
	s.namespaces = next
	return nil
}
