package leasecore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"golang.org/x/sys/unix"
)

// namespaceFile is the on-disk form of <state>/namespaces.toml.
type namespaceFile struct {
	Namespace []namespaceRecord `toml:"namespace"`
}

type namespaceRecord struct {
	Path      string     `toml:"path"`
	UID       int64      `toml:"uid"`
	GID       int64      `toml:"gid"`
	CreatedAt recordTime `toml:"created_at"`
}

// recordTime is a time in the namespaces file: written as an RFC 3339 UTC
// string with nanoseconds, like the times of lease records; read from such
// a string or from a native TOML datetime.
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

func removeFile(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return &PersistError{Op: "remove", Path: path, Err: err}
	}
	return nil
}

// loadNamespaces reads the namespaces file; a missing file means none.
// Entries whose path is invalid or whose parent is missing are skipped.
func (s *FileStore) loadNamespaces() error {
	data, err := readStateFile(filepath.Join(s.state, namespacesName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if errors.Is(err, errNotRegular) {
		s.opts.Logger.Warn("ignoring a namespaces file that is not a regular file", "path", filepath.Join(s.state, namespacesName))
		return nil
	}
	if err != nil {
		return fmt.Errorf("leasecore: read namespaces: %w", err)
	}
	var nf namespaceFile
	if _, err := toml.Decode(string(data), &nf); err != nil {
		s.opts.Logger.Warn("ignoring corrupt namespaces file", "path", filepath.Join(s.state, namespacesName), "err", err)
		return nil
	}
	// Parents sort before their children.
	slices.SortFunc(nf.Namespace, func(a, b namespaceRecord) int { return strings.Compare(a.Path, b.Path) })
	for _, r := range nf.Namespace {
		if ValidateResource(r.Path) != nil || r.UID < 0 || r.UID > 1<<32-1 || r.GID < 0 || r.GID > 1<<32-1 {
			continue
		}
		if p := parentOf(r.Path); p != "" {
			if _, ok := s.namespaces[p]; !ok {
				continue
			}
		}
		s.namespaces[r.Path] = Namespace{Path: r.Path, UID: uint32(r.UID), GID: uint32(r.GID), CreatedAt: r.CreatedAt.UTC()}
	}
	return nil
}

// saveNamespaces persists nss durably. The caller holds mu.
func (s *FileStore) saveNamespaces(nss map[string]Namespace) error {
	var nf namespaceFile
	for _, ns := range nss {
		nf.Namespace = append(nf.Namespace, namespaceRecord{
			Path: ns.Path, UID: int64(ns.UID), GID: int64(ns.GID), CreatedAt: recordTime{ns.CreatedAt},
		})
	}
	slices.SortFunc(nf.Namespace, func(a, b namespaceRecord) int { return strings.Compare(a.Path, b.Path) })
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(nf); err != nil {
		return fmt.Errorf("leasecore: encode namespaces: %w", err)
	}
	s.recMu.Lock()
	defer s.recMu.Unlock()
	unlock, err := s.flock(unix.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	return writeFile(s.stFile, filepath.Join(s.state, namespacesName), buf.Bytes())
}

// Namespace returns the namespace at path; see [Store.Namespace].
func (s *store) Namespace(ctx context.Context, path string) (_ Namespace, err error) {
	if err := s.begin(false); err != nil {
		return Namespace{}, err
	}
	defer s.unlock(&err)
	ns, ok := s.namespaces[path]
	if !ok {
		return Namespace{}, fmt.Errorf("%w: namespace %q", ErrNotFound, path)
	}
	return ns, nil
}

// Mkdir creates namespace path; see [Store.Mkdir]. A uid may own at most
// Options.MaxLeasesPerUID namespaces (ErrQuota), so that one user cannot
// exhaust the store (docs/PROTOCOL.md §7).
func (s *store) Mkdir(ctx context.Context, path string, uid, gid uint32) (_ Namespace, err error) {
	if err := ValidateResource(path); err != nil {
		return Namespace{}, err
	}
	if err := s.begin(true); err != nil {
		return Namespace{}, err
	}
	defer s.unlock(&err)
	if p := parentOf(path); p != "" {
		if _, ok := s.namespaces[p]; !ok {
			return Namespace{}, fmt.Errorf("%w: %q", ErrNoNamespace, p)
		}
	}
	if _, ok := s.namespaces[path]; ok {
		return Namespace{}, fmt.Errorf("%w: namespace %q", ErrExists, path)
	}
	owned := 0
	for _, ns := range s.namespaces {
		if ns.UID == uid {
			owned++
		}
	}
	if owned >= s.opts.MaxLeasesPerUID {
		return Namespace{}, fmt.Errorf("%w: uid %d owns %d namespaces", ErrQuota, uid, owned)
	}
	if e := s.live[path]; e != nil {
		if live, err := s.checkLive(e); err != nil {
			return Namespace{}, err
		} else if live {
			return Namespace{}, fmt.Errorf("%w: %q is a live lease", ErrExists, path)
		}
	}
	ns := Namespace{Path: path, UID: uid, GID: gid, CreatedAt: s.opts.Clock.Now().UTC().Truncate(time.Millisecond)}
	next := maps.Clone(s.namespaces)
	next[path] = ns
	if err := s.persist.saveNamespaces(next); err != nil {
		return Namespace{}, err
	}
	s.namespaces = next
	return ns, nil
}

// Rmdir removes an empty namespace; see [Store.Rmdir].
func (s *store) Rmdir(ctx context.Context, path string) (err error) {
	if err := s.begin(true); err != nil {
		return err
	}
	defer s.unlock(&err)
	if _, ok := s.namespaces[path]; !ok {
		return fmt.Errorf("%w: namespace %q", ErrNotFound, path)
	}
	prefix := path + "/"
	for p := range s.namespaces {
		if strings.HasPrefix(p, prefix) {
			return fmt.Errorf("%w: %q holds namespace %q", ErrNotEmpty, path, p)
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
			return fmt.Errorf("%w: %q holds live lease %q", ErrNotEmpty, path, r)
		}
	}
	next := maps.Clone(s.namespaces)
	delete(next, path)
	if err := s.persist.saveNamespaces(next); err != nil {
		return err
	}
	s.namespaces = next
	return nil
}
