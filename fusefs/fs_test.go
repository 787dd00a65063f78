package fusefs

import (
	"bytes"
	"context"
	"github.com/leasefs/leasefs/internal/engine"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/internal/leaktest"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// TestMain fails the package when a goroutine of Run outlives the tests.
func TestMain(m *testing.M) { leaktest.Main(m, "fusefs.(*FS).Run(") }

const (
	uidAlice = 1000
	uidBob   = 1001
	uidRoot  = 0
)

// testEnv is a lease filesystem over an in-memory store with a fake clock,
// built without a mount.
type testEnv struct {
	clock *clocktest.FakeClock
	store *engine.MemStore
	fsys  *FS
	root  *dirNode
}

// newEnv builds the node tree of a filesystem over a fresh store. The zero
// opts fields take the store's defaults; the clock is always fake.
func newEnv(t *testing.T, opts leasecore.Options) *testEnv {
	t.Helper()
	clock := clocktest.NewFakeClock(time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC))
	opts.Clock = clock
	opts.Logger = slog.New(slog.DiscardHandler)
	if opts.Host == "" {
		opts.Host = "testhost"
	}
	store := engine.NewMemStore(opts)
	t.Cleanup(func() { _ = store.Close() })
	return newEnvOn(t, clock, store, store)
}

// newEnvOn builds the node tree over s (which may wrap mem).
func newEnvOn(t *testing.T, clock *clocktest.FakeClock, mem *engine.MemStore, s leasecore.Store) *testEnv {
	t.Helper()
	f := New(s, Options{Logger: slog.New(slog.DiscardHandler)})
	_ = f.RawFileSystem() // initialises the inode tree
	return &testEnv{clock: clock, store: mem, fsys: f, root: f.root}
}

// as returns a request context from uid (gid = uid), from this process.
func as(uid uint32) context.Context {
	return fuse.NewContext(context.Background(), &fuse.Caller{
		Owner: fuse.Owner{Uid: uid, Gid: uid},
		Pid:   uint32(os.Getpid()),
	})
}

// create calls Create on d and checks the handle type.
func create(t *testing.T, ctx context.Context, d *dirNode, name string, flags uint32) (*fs.Inode, *leaseHandle, *fuse.EntryOut, syscall.Errno) {
	t.Helper()
	var out fuse.EntryOut
	ino, fh, fuseFlags, errno := d.Create(ctx, name, flags, 0o644, &out)
	if errno != 0 {
		if ino != nil || fh != nil {
			t.Errorf("Create(%q) = errno %v with a node or handle", name, errno)
		}
		return nil, nil, &out, errno
	}
	if fuseFlags&fuse.FOPEN_DIRECT_IO == 0 {
		t.Errorf("Create(%q) flags %#x lack FOPEN_DIRECT_IO", name, fuseFlags)
	}
	h, ok := fh.(*leaseHandle)
	if !ok {
		t.Fatalf("Create(%q) handle is %T", name, fh)
	}
	return ino, h, &out, 0
}

// mustCreate reserves name in d as ctx's caller with O_CREAT|O_EXCL|O_RDWR.
func mustCreate(t *testing.T, ctx context.Context, d *dirNode, name string) (*leaseNode, *leaseHandle) {
	t.Helper()
	ino, h, _, errno := create(t, ctx, d, name, syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDWR)
	if errno != 0 {
		t.Fatalf("Create(%q): %v", name, errno)
	}
	return ino.Operations().(*leaseNode), h
}

// read reads from h at off into a buffer of n bytes.
func read(ctx context.Context, h *leaseHandle, n int, off int64) ([]byte, syscall.Errno) {
	res, errno := h.Read(ctx, make([]byte, n), off)
	if errno != 0 {
		return nil, errno
	}
	b, st := res.Bytes(make([]byte, n))
	if st != fuse.OK {
		return nil, syscall.Errno(st)
	}
	return bytes.Clone(b), 0
}

// readDoc reads h from offset 0 to the end in chunks of chunk bytes, as
// cat does on a direct-I/O file.
func readDoc(t *testing.T, ctx context.Context, h *leaseHandle, chunk int) []byte {
	t.Helper()
	var doc []byte
	for off := int64(0); ; {
		b, errno := read(ctx, h, chunk, off)
		if errno != 0 {
			t.Fatalf("Read at %d: %v", off, errno)
		}
		if len(b) == 0 {
			return doc
		}
		if len(b) > chunk {
			t.Fatalf("Read at %d returned %d bytes into %d", off, len(b), chunk)
		}
		doc = append(doc, b...)
		off += int64(len(b))
		if off > 1<<20 {
			t.Fatalf("Read never reaches the end")
		}
	}
}

// readToken reads the token from h, checking its form.
func readToken(t *testing.T, ctx context.Context, h *leaseHandle) string {
	t.Helper()
	b, errno := read(ctx, h, 4096, 0)
	if errno != 0 {
		t.Fatalf("Read token: %v", errno)
	}
	tok, ok := strings.CutSuffix(string(b), "\n")
	if !ok || !strings.HasPrefix(tok, leasecore.TokenPrefix) || len(tok) != len(leasecore.TokenPrefix)+39 {
		t.Fatalf("first read = %q, want hwl_<39 chars> and a newline", b)
	}
	return tok
}

// write writes payload to h at offset 0.
func write(ctx context.Context, h *leaseHandle, payload string) syscall.Errno {
	n, errno := h.Write(ctx, []byte(payload), 0)
	if errno == 0 && int(n) != len(payload) {
		return syscall.EIO
	}
	return errno
}

// liveCount returns the number of live leases in the store.
func liveCount(t *testing.T, s leasecore.Store) int {
	t.Helper()
	ls, err := s.List(context.Background())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return len(ls)
}

// hasToken reports whether f still keeps the unrevealed token of lease id.
func hasToken(f *FS, id string) bool {
	f.tokens.mu.Lock()
	defer f.tokens.mu.Unlock()
	_, ok := f.tokens.tokens[id]
	return ok
}

// startRun runs f.Run until the test ends.
func startRun(t *testing.T, f *FS) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// waitUntil polls cond; the bound is a guard against a hang, not a timing
// assertion.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// The store's reaper ends an expired lease on its own; Run, following the
// change feed, forgets its unrevealed token.
func TestRunFollowsExpiry(t *testing.T) {
	e := newEnv(t, leasecore.Options{LeaseDuration: time.Minute, ReapInterval: time.Hour})
	var out fuse.EntryOut
	nsIno, errno := e.root.Mkdir(as(uidAlice), "ns", 0o755, &out)
	if errno != 0 {
		t.Fatalf("Mkdir: %v", errno)
	}
	ns := nsIno.Operations().(*dirNode)
	ino, _, _, errno := create(t, as(uidAlice), ns, "job", syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDWR)
	if errno != 0 {
		t.Fatalf("Create: %v", errno)
	}
	// Attach the nodes as the kernel bridge would, so that Run walks the
	// tree to invalidate the ended lease (NotifyDelete answers ENOSYS
	// without a server).
	e.root.AddChild("ns", nsIno, false)
	nsIno.AddChild("job", ino, false)
	id := ino.Operations().(*leaseNode).id
	startRun(t, e.fsys)

	e.clock.Advance(time.Minute + time.Second)
	// A read finds the lease dead and wakes the reaper, which ends it.
	if n := liveCount(t, e.store); n != 0 {
		t.Errorf("%d live leases after expiry, want 0", n)
	}
	waitUntil(t, "the reaper to end the lease", func() bool {
		l, err := e.store.Load(context.Background(), id)
		hist, _ := e.store.History(context.Background(), "ns/job")
		return err == nil && l.Status == leasecore.StatusAbandoned && len(hist) == 1
	})
	waitUntil(t, "Run to forget the unrevealed token", func() bool { return !hasToken(e.fsys, id) })
}

// Leases ended by a write reach Run through the store's feed, and Run
// survives invalidating them without a server.
func TestRunFollowsRelease(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	ctx := as(uidAlice)
	n, h := mustCreate(t, ctx, e.root, "q")
	e.root.AddChild("q", n.EmbeddedInode(), false)
	n2, _ := mustCreate(t, ctx, e.root, "r")
	startRun(t, e.fsys)
	tok := readToken(t, ctx, h)
	if errno := write(ctx, h, "token = \""+tok+"\"\naction = \"complete\"\n"); errno != 0 {
		t.Fatalf("complete: %v", errno)
	}
	if errno := e.root.Unlink(ctx, "r"); errno != 0 {
		t.Fatalf("unlink: %v", errno)
	}
	waitUntil(t, "Run to forget the token of the unlinked lease", func() bool { return !hasToken(e.fsys, n2.id) })
}

func TestNewDefaults(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	f := New(e.store, Options{})
	if f.log == nil {
		t.Error("nil logger")
	}
	if f.opts.RootUID != uint32(os.Getuid()) || f.opts.RootGID != uint32(os.Getgid()) {
		t.Errorf("root owner %d:%d, want the daemon's", f.opts.RootUID, f.opts.RootGID)
	}
}

func TestSplitJoinResource(t *testing.T) {
	for _, r := range []string{"a", "a/b", "a/b/c"} {
		dir, name := splitResource(r)
		if got := joinResource(dir, name); got != r {
			t.Errorf("join(split(%q)) = %q", r, got)
		}
	}
	if dir, name := splitResource("a/b/c"); dir != "a/b" || name != "c" {
		t.Errorf("split(a/b/c) = %q, %q", dir, name)
	}
}

func TestCallerOfWithoutCaller(t *testing.T) {
	if c := callerOf(context.Background()); c != (caller{uid: nobody, gid: nobody}) {
		t.Errorf("callerOf(no caller) = %+v, want the unprivileged nobody", c)
	}
	c := callerOf(as(uidBob))
	if c.uid != uidBob || c.gid != uidBob || c.pid() != os.Getpid() {
		t.Errorf("callerOf = %+v, want uid/gid %d pid %d", c, uidBob, os.Getpid())
	}
}
