package mount

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/leasefs/leasefs/internal/daemonlock"
)

func TestNested(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"/s", "/s", true},
		{"/s", "/s/m", true},
		{"/s/m", "/s", true},
		{"/s", "/m", false},
		{"/s", "/state", false},
		{"/s/..m", "/s", true},
		{"/a/b", "/a/c", false},
	}
	for _, tc := range tests {
		if got := nested(tc.a, tc.b); got != tc.want {
			t.Errorf("nested(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestDefaultStateDir(t *testing.T) {
	t.Setenv("LEASEFS_STATE", "/x/state")
	if got := DefaultStateDir(); got != "/x/state" {
		t.Errorf("with LEASEFS_STATE: %q", got)
	}
	t.Setenv("LEASEFS_STATE", "")
	t.Setenv("XDG_STATE_HOME", "/xdg")
	want := "/xdg/leasefs"
	if os.Geteuid() == 0 {
		want = "/var/lib/leasefs"
	}
	if got := DefaultStateDir(); got != want {
		t.Errorf("DefaultStateDir() = %q, want %q", got, want)
	}
}

func TestRunRefusesNestedMountpoint(t *testing.T) {
	state := t.TempDir()
	mp := filepath.Join(state, "mnt")
	if err := os.Mkdir(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	err := Run(context.Background(), withFileStore(Options{Mountpoint: mp, StateDir: state}))
	if !errors.Is(err, ErrInsideState) {
		t.Fatalf("Run with the mountpoint inside the state directory = %v, want ErrInsideState", err)
	}
	err = Run(context.Background(), withFileStore(Options{Mountpoint: state, StateDir: filepath.Join(state, "inner")}))
	if !errors.Is(err, ErrInsideState) {
		t.Fatalf("Run with the state directory inside the mountpoint = %v, want ErrInsideState", err)
	}
}

func TestRunRefusesHeldStateDir(t *testing.T) {
	state := t.TempDir()
	lock, err := daemonlock.Acquire(filepath.Join(state, DaemonLockName), daemonlock.CurrentHolder("other daemon"))
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	err = Run(context.Background(), withFileStore(Options{Mountpoint: t.TempDir(), StateDir: state}))
	var held *daemonlock.HeldError
	if !errors.As(err, &held) || held.Holder.Client != "other daemon" {
		t.Fatalf("Run on a held state directory = %v, want a HeldError naming the holder", err)
	}
}

// withFileStore returns opts serving the file store of opts.StateDir.
func withFileStore(opts Options) Options {
	opts.OpenStore = FileStoreOpener(opts)
	return opts
}

func TestRunNeedsAStore(t *testing.T) {
	if err := Run(context.Background(), Options{Mountpoint: t.TempDir(), StateDir: t.TempDir()}); !errors.Is(err, ErrNoStore) {
		t.Fatalf("Run without OpenStore = %v, want ErrNoStore", err)
	}
}
