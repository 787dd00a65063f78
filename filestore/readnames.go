package filestore

import (
	"bytes"
	"encoding/binary"
	"errors"

	"golang.org/x/sys/unix"
)

// readNamesBuffer is the getdents64(2) buffer of readNames: glibc's
// readdir uses 32 KiB; larger buffers gain nothing on ext4, whose cost is
// per entry.
const readNamesBuffer = 32 << 10

// readNames returns the names in the directory open as fd from its current
// offset on, without "." and "..", in the directory's order. The names
// share one string: a directory of 100,000 records is one allocation of
// its names instead of 100,000, which in a fresh process is 40 ms less of
// the 110 ms that listing takes (os.File.Readdirnames). A name kept beyond
// the load must be cloned ([strings.Clone]), or it keeps them all.
// Errors: getdents64's.
func readNames(fd int) ([]string, error) {
	buf := make([]byte, readNamesBuffer)
	var text []byte
	var ends []int
	for {
		n, err := unix.Getdents(fd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			break
		}
		// struct linux_dirent64: ino (8), off (8), reclen (2), type (1),
		// then the name, NUL-terminated and padded to reclen.
		for rec := buf[:n]; len(rec) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(rec[16:]))
			if reclen < 19 || reclen > len(rec) {
				return nil, errors.New("getdents64: malformed record")
			}
			name := rec[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			ino := binary.NativeEndian.Uint64(rec)
			rec = rec[reclen:]
			if ino == 0 || string(name) == "." || string(name) == ".." {
				continue
			}
			text = append(text, name...)
			ends = append(ends, len(text))
		}
	}
	all := string(text)
	names := make([]string, len(ends))
	from := 0
	for i, end := range ends {
		names[i], from = all[from:end], end
	}
	return names, nil
}
