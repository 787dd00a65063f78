package procfs

import "testing"

func TestUnescapeOctal(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/x\134y`: `/x\y`, `/plain`: "/plain", `/end\04`: `/end\04`} {
		if got := unescapeOctal(in); got != want {
			t.Errorf("unescapeOctal(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestContainingMount(t *testing.T) {
	mounts := []MountInfo{{"/", "ext4", "1", "", 21}, {"/mnt", "tmpfs", "2", "", 22}, {"/mnt/l", "fuse.leasefs", "3", "", 23}, {"/mnt", "ext4", "4", "", 24}}
	for path, want := range map[string]string{"/mnt/l/state": "fuse.leasefs", "/mnt/x": "ext4", "/srv": "ext4", "/mnt/l": "fuse.leasefs"} {
		if m, ok := ContainingMount(mounts, path); !ok || m.FSType != want {
			t.Errorf("ContainingMount(%q) = %+v, %v; want %s", path, m, ok, want)
		}
	}
	if len(Mounts()) == 0 {
		t.Errorf("Mounts found no mounts in /proc/self/mountinfo")
	}
}
