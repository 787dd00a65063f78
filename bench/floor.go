package main

import (
	"context"
	"fmt"
	"github.com/leasefs/leasefs/filestore"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/leasecore"
)

// record300 is a payload the size of a lease record (docs/PROTOCOL.md §4.3).
var record300 = []byte(strings.Repeat("x", 299) + "\n")

// floorRows runs rows 4r (the atomic durable write every store change
// costs: pending file, fsync, rename, directory fsync; as renameio does)
// and 4f (one 300-byte pwrite and fdatasync of a preallocated file).
func (b *bench) floorRows() error {
	if !b.wantAny(map[string]string{"4r": nameRename, "4f": nameFsync}) {
		return nil
	}
	dir := filepath.Join(b.tmp, "floor")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	err := b.cellRow("4r", nameRename, func(clients, i int) (cycle, func(), error) {
		d, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, nil, err
		}
		final := filepath.Join(dir, fmt.Sprintf("rec%d-%d.toml", clients, i))
		tmp := final + ".tmp"
		return func() error {
			fd, err := unix.Open(tmp, unix.O_CREAT|unix.O_TRUNC|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
			if err != nil {
				return err
			}
			if _, err := unix.Write(fd, record300); err != nil {
				_ = unix.Close(fd)
				return err
			}
			if err := unix.Fsync(fd); err != nil {
				_ = unix.Close(fd)
				return err
			}
			if err := unix.Close(fd); err != nil {
				return err
			}
			if err := unix.Rename(tmp, final); err != nil {
				return err
			}
			return unix.Fsync(d)
		}, func() { _ = unix.Close(d) }, nil
	})
	if err != nil {
		return err
	}
	return b.cellRow("4f", nameFsync, func(clients, i int) (cycle, func(), error) {
		p := filepath.Join(dir, fmt.Sprintf("raw%d-%d", clients, i))
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, nil, err
		}
		if err := unix.Fallocate(fd, 0, 0, 4096); err != nil {
			_ = unix.Close(fd)
			return nil, nil, err
		}
		if _, err := unix.Pwrite(fd, record300, 0); err != nil {
			_ = unix.Close(fd)
			return nil, nil, err
		}
		if err := unix.Fsync(fd); err != nil {
			_ = unix.Close(fd)
			return nil, nil, err
		}
		return func() error {
			if _, err := unix.Pwrite(fd, record300, 0); err != nil {
				return err
			}
			return unix.Fdatasync(fd)
		}, func() { _ = unix.Close(fd) }, nil
	})
}

// storeRows runs row 2: leasecore's file store in this process, with no
// FUSE, Reserve and End of the client's own name per cycle.
func (b *bench) storeRows() error {
	if !b.want("2", nameStore) {
		return nil
	}
	state := filepath.Join(b.tmp, "store")
	s, err := filestore.Open(state, filestore.Options{})
	if err != nil {
		return err
	}
	defer s.Close()
	ctx := context.Background()
	return b.cellRow("2", nameStore, func(clients, i int) (cycle, func(), error) {
		d := leasecore.Draft{Resource: fmt.Sprintf("store%d-%d", clients, i)}
		return func() error {
			g, err := s.Reserve(ctx, d)
			if err != nil {
				return err
			}
			_, err = s.End(ctx, g.Lease.ID, leasecore.StatusComplete)
			return err
		}, nil, nil
	})
}
