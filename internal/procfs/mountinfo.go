package procfs

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MountInfo is one line of /proc/self/mountinfo (proc(5)).
type MountInfo struct {
	Point  string // mount point, unescaped
	FSType string // e.g. "fuse.leasefs", "ext4"
	Minor  string // device minor number; names a FUSE connection in fusectl
	Source string // mount source, e.g. "/dev/vda"; a leasefs mount's is its state directory
	ID     int    // mount id, unique among attached mounts (the mnt_id of /proc/PID/fdinfo)
}

// Mounts parses /proc/self/mountinfo, in mount order (a later entry on the
// same point is mounted on top); nil when it cannot be read. Safe for
// concurrent use.
func Mounts() []MountInfo {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []MountInfo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw"
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		_, minor, _ := strings.Cut(fields[2], ":")
		id, _ := strconv.Atoi(fields[0])
		m := MountInfo{Point: unescapeOctal(fields[4]), FSType: fields[sep+1], Minor: minor, ID: id}
		if sep+2 < len(fields) {
			m.Source = unescapeOctal(fields[sep+2])
		}
		out = append(out, m)
	}
	return out
}

// unescapeOctal undoes mountinfo's \ooo escapes (space, tab, newline, \).
func unescapeOctal(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// MountedAt returns the topmost mount of mounts whose mount point is path;
// false when none is.
func MountedAt(mounts []MountInfo, path string) (MountInfo, bool) {
	var found MountInfo
	ok := false
	for _, m := range mounts {
		if m.Point == path {
			found, ok = m, true // later lines are mounted on top
		}
	}
	return found, ok
}

// ContainingMount returns the mount of mounts that holds path: the topmost
// mount on the longest mount point that is path or one of its ancestors;
// false when none is (path is cleaned, not resolved). Safe for concurrent use.
func ContainingMount(mounts []MountInfo, path string) (MountInfo, bool) {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		if m, ok := MountedAt(mounts, p); ok {
			return m, true
		}
		if p == "/" || p == "." {
			return MountInfo{}, false
		}
	}
}
