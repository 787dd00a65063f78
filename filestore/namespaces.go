package filestore

import (
	"github.com/leasefs/leasefs/leasecore"

	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
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
		return &leasecore.PersistError{Op: "remove", Path: path, Err: err}
	}
	return nil
}

// loadNamespaces reads the namespaces file into the engine; a missing file
// means none.
// Entries whose path is invalid or whose parent is missing are skipped.
func (s *Store) loadNamespaces() error {
	data, err := readStateFile(filepath.Join(s.state, namespacesName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if errors.Is(err, errNotRegular) {
		s.opts.Logger.Warn("ignoring a namespaces file that is not a regular file", "path", filepath.Join(s.state, namespacesName))
		return nil
	}
	if err != nil {
		return fmt.Errorf("filestore: read namespaces: %w", err)
	}
	var nf namespaceFile
	if _, err := toml.Decode(string(data), &nf); err != nil {
		s.opts.Logger.Warn("ignoring corrupt namespaces file", "path", filepath.Join(s.state, namespacesName), "err", err)
		return nil
	}
	// Parents sort before their children.
	slices.SortFunc(nf.Namespace, func(a, b namespaceRecord) int { return strings.Compare(a.Path, b.Path) })
	nss := make(map[string]leasecore.Namespace, len(nf.Namespace))
	for _, r := range nf.Namespace {
		if leasecore.ValidateResource(r.Path) != nil || r.UID < 0 || r.UID > 1<<32-1 || r.GID < 0 || r.GID > 1<<32-1 {
			continue
		}
		if p := leasecore.ParentOf(r.Path); p != "" {
			if _, ok := nss[p]; !ok {
				continue
			}
		}
		nss[r.Path] = leasecore.Namespace{Path: r.Path, UID: uint32(r.UID), GID: uint32(r.GID), CreatedAt: r.CreatedAt.UTC()}
	}
	s.seam.SetNamespaces(nss)
	return nil
}

// saveNamespaces persists nss durably (persister). The caller holds the
// engine's lock.
func (s *Store) saveNamespaces(nss map[string]leasecore.Namespace) error {
	var nf namespaceFile
	for _, ns := range nss {
		nf.Namespace = append(nf.Namespace, namespaceRecord{
			Path: ns.Path, UID: int64(ns.UID), GID: int64(ns.GID), CreatedAt: recordTime{ns.CreatedAt},
		})
	}
	slices.SortFunc(nf.Namespace, func(a, b namespaceRecord) int { return strings.Compare(a.Path, b.Path) })
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(nf); err != nil {
		return fmt.Errorf("filestore: encode namespaces: %w", err)
	}
	unlock, err := s.lockRecords()
	if err != nil {
		return err
	}
	defer unlock()
	return writeFile(s.stFile, filepath.Join(s.state, namespacesName), buf.Bytes())
}
