package openfiles

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// keyOf returns the open file of descriptor fd of this process.
func keyOf(t *testing.T, fd uintptr) Key {
	t.Helper()
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(int(fd)))
	if err != nil {
		t.Fatal(err)
	}
	k, ok := parseFDInfo(b)
	if !ok {
		t.Fatalf("fdinfo without mnt_id or ino: %q", b)
	}
	return k
}

func TestScanFindsTheHolderUntilClose(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "held"))
	if err != nil {
		t.Fatal(err)
	}
	k := keyOf(t, f.Fd())
	sc, err := ScanMounts("/proc", []int{k.Mount}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(sc.Holders[k], os.Getpid()) {
		t.Fatalf("scan of %v: holders %v, want this process %d among them", k, sc.Holders[k], os.Getpid())
	}
	if !Holds("/proc", os.Getpid(), k) {
		t.Fatalf("Holds(%d, %v) = false while the file is open", os.Getpid(), k)
	}
	f.Close()
	if Holds("/proc", os.Getpid(), k) {
		t.Fatalf("Holds(%d, %v) = true after close", os.Getpid(), k)
	}
	sc, err = ScanMounts("/proc", []int{k.Mount}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(sc.Holders[k], os.Getpid()) {
		t.Fatalf("scan after close still names this process: %v", sc.Holders[k])
	}
}

func TestScanOfNoMountsFindsNothing(t *testing.T) {
	sc, err := ScanMounts("/proc", nil, nil)
	if err != nil || len(sc.Holders) != 0 {
		t.Fatalf("ScanMounts(nil) = %v, %v; want nothing", sc, err)
	}
}

func TestParseFDInfo(t *testing.T) {
	k, ok := parseFDInfo([]byte("pos:\t0\nflags:\t0100002\nmnt_id:\t321\nino:\t1099511627781\nlock:\t1: FLOCK  ADVISORY  WRITE 77 00:3b:1099511627781 0 EOF\n"))
	if !ok || k != (Key{Mount: 321, Ino: 1<<40 + 5}) {
		t.Fatalf("parseFDInfo = %v, %v", k, ok)
	}
	if _, ok := parseFDInfo([]byte("pos:\t0\nflags:\t02\n")); ok {
		t.Fatal("parseFDInfo accepted an fdinfo without mnt_id and ino")
	}
}

// BenchmarkScanMounts is one full pass over /proc, what a starting daemon
// makes once and a running one makes when the known holders of a surviving
// handle lease have all let go.
func BenchmarkScanMounts(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "held"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	bb, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(int(f.Fd())))
	if err != nil {
		b.Fatal(err)
	}
	k, _ := parseFDInfo(bb)
	for b.Loop() {
		if _, err := ScanMounts("/proc", []int{k.Mount}, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// TestComm reads the command name of this process and of a missing one.
func TestComm(t *testing.T) {
	if c := Comm("/proc", os.Getpid()); c == "" {
		t.Errorf("Comm of this process = %q, want its command name", c)
	}
	if c := Comm(t.TempDir(), 10); c != "" {
		t.Errorf("Comm of a missing process = %q, want \"\"", c)
	}
}
