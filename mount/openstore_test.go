package mount

import (
	"context"
	"errors"
	"github.com/leasefs/leasefs/filestore"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/internal/syncbuf"
	"github.com/leasefs/leasefs/internal/testenv"
	"github.com/leasefs/leasefs/leasecore"
)

// ctxKey marks the context given to Run, to see it reach the opener.
type ctxKey struct{}

// stateFiles returns the names in the state directory state, sorted.
func stateFiles(t *testing.T, state string) []string {
	t.Helper()
	entries, err := os.ReadDir(state)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestRunOpenStoreError gives Run an opener that fails: Run returns its error
// without mounting, having called it once under the daemon lock with Run's
// context and logger and neither OnReady nor OnStopping, and leaves in the
// state directory only the lock file, which is never removed.
func TestRunOpenStoreError(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	mp := t.TempDir()
	lockPath := filepath.Join(state, DaemonLockName)
	errNoBackend := errors.New("no such backend")
	log := slog.New(slog.DiscardHandler)
	// Should Run mount despite the opener, the deadline ends the serving.
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), ctxKey{}, "run"), 5*time.Second)
	defer cancel()
	calls := 0
	err := Run(ctx, Options{
		Mountpoint: mp,
		StateDir:   state,
		Logger:     log,
		OnReady:    func() { t.Error("OnReady called, but Run did not mount") },
		OnStopping: func() { t.Error("OnStopping called, but Run did not mount") },
		OpenStore: func(octx context.Context, olog *slog.Logger, _ StoreHooks) (leasecore.Store, error) {
			calls++
			if octx.Value(ctxKey{}) != "run" {
				t.Error("the opener did not get Run's context")
			}
			if olog != log {
				t.Error("the opener did not get Run's logger")
			}
			if held, ok := daemonlock.Held(lockPath); !ok || !held {
				t.Errorf("daemon lock while opening the store: held %v, ok %v; want held", held, ok)
			}
			if h, ok := daemonlock.ReadHolder(lockPath); !ok || h.PID != os.Getpid() {
				t.Errorf("daemon lock holder while opening the store: %+v, %v; want this process", h, ok)
			}
			return nil, errNoBackend
		},
	})
	if !errors.Is(err, errNoBackend) {
		t.Fatalf("Run with a failing opener = %v, want its error", err)
	}
	if calls != 1 {
		t.Errorf("opener called %d times, want 1", calls)
	}
	if m, ok := procfs.MountedAt(procfs.Mounts(), mp); ok {
		t.Errorf("Run left a mount on %s: %+v", mp, m)
	}
	if got, want := stateFiles(t, state), []string{DaemonLockName}; !slices.Equal(got, want) {
		t.Errorf("state directory holds %q, want only %q", got, want)
	}
	if held, _ := daemonlock.Held(lockPath); held {
		t.Error("daemon lock still held after Run returned")
	}
}

// TestRunOpenStoreNil gives Run an opener that returns neither a store nor an
// error: Run fails instead of serving nothing.
func TestRunOpenStoreNil(t *testing.T) {
	// Should Run mount anyway, the deadline ends the serving.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := Run(ctx, Options{
		Mountpoint: t.TempDir(),
		StateDir:   t.TempDir(),
		Logger:     slog.New(slog.DiscardHandler),
		OpenStore:  func(context.Context, *slog.Logger, StoreHooks) (leasecore.Store, error) { return nil, nil },
	})
	if err == nil {
		t.Fatal("Run with an opener returning no store succeeded")
	}
}

// closeCounter is a store that counts its Close calls.
type closeCounter struct {
	leasecore.Store
	closes atomic.Int32
}

func (s *closeCounter) Close() error {
	s.closes.Add(1)
	return s.Store.Close()
}

// mountedHandler is a slog handler that keeps the attributes of the
// "mounted" record and closes ready when it arrives. It is safe for
// concurrent use.
type mountedHandler struct {
	slog.Handler
	once  *sync.Once
	ready chan struct{}
	attrs map[string]string // written before ready is closed
}

func newMountedHandler(w *syncbuf.Buffer) *mountedHandler {
	return &mountedHandler{
		Handler: slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}),
		once:    new(sync.Once),
		ready:   make(chan struct{}),
		attrs:   make(map[string]string),
	}
}

func (h *mountedHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "mounted" {
		h.once.Do(func() {
			r.Attrs(func(a slog.Attr) bool {
				h.attrs[a.Key] = a.Value.String()
				return true
			})
			close(h.ready)
		})
	}
	return h.Handler.Handle(ctx, r)
}

// TestRunServesOpenedStore mounts a store that lives outside the state
// directory: a file created through the mount is a lease of that store, the
// state directory gets nothing but the daemon lock, the "mounted" line
// reports Options.LeaseDuration, and Run closes the store once.
func TestRunServesOpenedStore(t *testing.T) {
	testenv.RequireFUSE(t)
	backing, err := filestore.Open(t.TempDir(), filestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store := &closeCounter{Store: backing}
	state, mp := t.TempDir(), t.TempDir()
	var out syncbuf.Buffer
	h := newMountedHandler(&out)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{
			Mountpoint:    mp,
			StateDir:      state,
			LeaseDuration: 7 * time.Second,
			Logger:        slog.New(h),
			OpenStore: func(context.Context, *slog.Logger, StoreHooks) (leasecore.Store, error) {
				return store, nil
			},
		})
	}()
	select {
	case <-h.ready:
	case err := <-done:
		t.Fatalf("Run returned before mounting: %v\nlog:\n%s", err, out.String())
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatalf("no mounted line within 10s; log:\n%s", out.String())
	}
	if got := h.attrs["lease_duration"]; got != "7s" {
		t.Errorf("mounted line lease_duration = %q, want the option's 7s", got)
	}

	f, err := os.OpenFile(filepath.Join(mp, "via-mount"), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		cancel()
		<-done
		t.Fatalf("create through the mount: %v", err)
	}
	f.Close()
	leases, err := backing.List(context.Background())
	if err != nil || len(leases) != 1 || leases[0].Resource != "via-mount" {
		t.Errorf("the opened store lists %+v, %v; want the lease created through the mount", leases, err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil after the context ended", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("Run did not return within 20s of the context ending; log:\n%s", out.String())
	}
	if n := store.closes.Load(); n != 1 {
		t.Errorf("Run closed the store %d times, want 1", n)
	}
	if _, err := backing.List(context.Background()); !errors.Is(err, leasecore.ErrClosed) {
		t.Errorf("List after Run returned: %v, want ErrClosed", err)
	}
	if got, want := stateFiles(t, state), []string{DaemonLockName, MountsRecordName}; !slices.Equal(got, want) {
		t.Errorf("state directory holds %q, want only %q", got, want)
	}
}
