package fusefs

import (
	"context"
	"errors"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/leasecore"
)

func TestCreateReserves(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	ctx := as(uidAlice)
	ino, h, out, errno := create(t, ctx, e.root, "feature-a", syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDWR)
	if errno != 0 {
		t.Fatalf("Create: %v", errno)
	}
	l, err := e.store.Live(context.Background(), "feature-a")
	if err != nil {
		t.Fatalf("Live: %v", err)
	}
	want := uint64(leaseInoBase) + l.Generation
	if got := ino.StableAttr().Ino; got != want {
		t.Errorf("inode %d, want leaseInoBase+generation = %d", got, want)
	}
	if out.Attr.Ino != want || out.Attr.Mode != syscall.S_IFREG|0o644 {
		t.Errorf("entry attr ino %d mode %o, want %d %o", out.Attr.Ino, out.Attr.Mode, want, syscall.S_IFREG|0o644)
	}
	if out.Attr.Uid != uidAlice || out.Attr.Gid != uidAlice {
		t.Errorf("entry attr owner %d:%d, want the caller's", out.Attr.Uid, out.Attr.Gid)
	}
	if l.HolderUID != uidAlice || l.Mode != leasecore.ModeToken {
		t.Errorf("lease holder uid %d mode %s", l.HolderUID, l.Mode)
	}

	tok := readToken(t, ctx, h)
	if _, err := e.store.Renew(context.Background(), l.ID, tok, leasecore.Annotations{}); err != nil {
		t.Errorf("the token read does not renew the lease: %v", err)
	}
	doc, errno := read(ctx, h, 4096, 0)
	if errno != 0 {
		t.Fatalf("second read: %v", errno)
	}
	if strings.Contains(string(doc), tok) || !strings.HasPrefix(string(doc), `resource = "feature-a"`) {
		t.Errorf("second read = %q, want the status document", doc)
	}
	if strings.Contains(string(doc), leasecore.HashToken(tok)) {
		t.Error("status document reveals the token hash")
	}
}

func TestReadChunked(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	ctx := as(uidAlice)
	_, h := mustCreate(t, ctx, e.root, "chunks")
	tok := readDoc(t, ctx, h, 7)
	if !strings.HasPrefix(string(tok), leasecore.TokenPrefix) || !strings.HasSuffix(string(tok), "\n") ||
		strings.Count(string(tok), "\n") != 1 {
		t.Fatalf("chunked token read = %q", tok)
	}
	doc := readDoc(t, ctx, h, 7)
	l, err := e.store.Live(context.Background(), "chunks")
	if err != nil {
		t.Fatal(err)
	}
	if want := leasecore.StatusDocument(l); string(doc) != string(want) {
		t.Errorf("chunked status read =\n%s\nwant exactly one document\n%s", doc, want)
	}
}

func TestReadByOtherUIDLeavesToken(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	_, aliceH := mustCreate(t, as(uidAlice), e.root, "shared")

	// Bob opens the existing lease read-only (create without O_EXCL).
	_, bobH, _, errno := create(t, as(uidBob), e.root, "shared", syscall.O_CREAT|syscall.O_RDONLY)
	if errno != 0 {
		t.Fatalf("Create by bob: %v", errno)
	}
	for _, h := range []*leaseHandle{bobH, aliceH} {
		doc, errno := read(as(uidBob), h, 4096, 0)
		if errno != 0 {
			t.Fatalf("read by bob: %v", errno)
		}
		if strings.Contains(string(doc), leasecore.TokenPrefix) {
			t.Fatalf("bob read the token: %q", doc)
		}
	}
	readToken(t, as(uidAlice), aliceH)
}

func TestRootReadsToken(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	_, h := mustCreate(t, as(uidAlice), e.root, "r")
	readToken(t, as(uidRoot), h)
	if doc, _ := read(as(uidAlice), h, 4096, 0); strings.Contains(string(doc), leasecore.TokenPrefix) {
		t.Error("token revealed twice")
	}
}

// TestTokenOnlyAtOffsetZero: a first read at a non-zero offset (pread) must
// not consume the token while returning only a fragment of it, or the
// holder loses the token for good (docs/PROTOCOL.md §3: "returns exactly the token and
// a newline, once").
func TestTokenOnlyAtOffsetZero(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	ctx := as(uidAlice)
	_, h := mustCreate(t, ctx, e.root, "pread")
	b, errno := read(ctx, h, 4096, 10)
	if errno != 0 {
		t.Fatalf("read at 10: %v", errno)
	}
	if strings.HasSuffix(string(b), "\n") && !strings.Contains(string(b), "=") {
		t.Errorf("read at offset 10 returned a token fragment %q and the token is gone", b)
	}
	readToken(t, ctx, h)
}

func TestCreateOnHeldName(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	mustCreate(t, as(uidAlice), e.root, "held")
	held, err := e.store.Live(context.Background(), "held")
	if err != nil {
		t.Fatal(err)
	}

	t.Run("O_EXCL", func(t *testing.T) {
		for _, uid := range []uint32{uidAlice, uidBob} {
			if _, _, _, errno := create(t, as(uid), e.root, "held", syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDWR); errno != syscall.EEXIST {
				t.Errorf("uid %d: Create O_EXCL on a held name = %v, want EEXIST", uid, errno)
			}
		}
	})
	t.Run("opens existing", func(t *testing.T) {
		for _, tc := range []struct {
			uid   uint32
			flags uint32
		}{
			{uidAlice, syscall.O_CREAT | syscall.O_WRONLY},
			{uidAlice, syscall.O_CREAT | syscall.O_RDWR | syscall.O_TRUNC},
			{uidBob, syscall.O_CREAT | syscall.O_RDONLY},
			{uidRoot, syscall.O_CREAT | syscall.O_WRONLY},
		} {
			ino, h, out, errno := create(t, as(tc.uid), e.root, "held", tc.flags)
			if errno != 0 {
				t.Fatalf("uid %d flags %#o: Create = %v, want the existing lease", tc.uid, tc.flags, errno)
			}
			if ino.StableAttr().Ino != leaseIno(held) || out.Attr.Ino != leaseIno(held) {
				t.Errorf("opened inode %d, want the existing %d", ino.StableAttr().Ino, leaseIno(held))
			}
			if h.leaseID() != held.ID || h.reserved {
				t.Errorf("handle bound to %s reserved=%v, want %s not reserved", h.leaseID(), h.reserved, held.ID)
			}
			if out.Attr.Uid != uidAlice {
				t.Errorf("attr uid %d, want the holder's", out.Attr.Uid)
			}
		}
		if n := liveCount(t, e.store); n != 1 {
			t.Errorf("%d live leases, want 1: nothing may be reserved", n)
		}
		if l, _ := e.store.Live(context.Background(), "held"); l.ID != held.ID {
			t.Errorf("live lease %s, want %s", l.ID, held.ID)
		}
	})
	t.Run("other uid for writing", func(t *testing.T) {
		for _, flags := range []uint32{syscall.O_CREAT | syscall.O_WRONLY, syscall.O_CREAT | syscall.O_RDWR} {
			if _, _, _, errno := create(t, as(uidBob), e.root, "held", flags); errno != syscall.EACCES {
				t.Errorf("flags %#o: Create by another uid = %v, want EACCES", flags, errno)
			}
		}
	})
}

func TestCreateErrors(t *testing.T) {
	e := newEnv(t, leasecore.Options{MaxLeasesPerUID: 2})
	ctx := as(uidAlice)
	flags := uint32(syscall.O_CREAT | syscall.O_EXCL | syscall.O_RDWR)
	var out fuse.EntryOut
	if _, errno := e.root.Mkdir(ctx, "dir", 0o755, &out); errno != 0 {
		t.Fatalf("Mkdir: %v", errno)
	}
	tests := []struct {
		name string
		want syscall.Errno
	}{
		{strings.Repeat("x", 256), syscall.ENAMETOOLONG},
		{"bad\xffutf8", syscall.EINVAL},
		{"", syscall.EINVAL},
		{".", syscall.EINVAL},
		{"..", syscall.EINVAL},
		{"nul\x00byte", syscall.EINVAL},
		{"a/b", syscall.EINVAL},
		{"dir", syscall.EISDIR},
	}
	for _, tt := range tests {
		if _, _, _, errno := create(t, ctx, e.root, tt.name, flags); errno != tt.want {
			t.Errorf("Create(%q) = %v, want %v", tt.name, errno, tt.want)
		}
	}
	if _, _, _, errno := create(t, ctx, e.root, strings.Repeat("é", 127)+"x", flags); errno != 0 {
		t.Errorf("Create of a 255-byte UTF-8 name = %v, want success", errno)
	}
	mustCreate(t, ctx, e.root, "second")
	if _, _, _, errno := create(t, ctx, e.root, "third", flags); errno != syscall.EDQUOT {
		t.Errorf("Create over the per-uid limit = %v, want EDQUOT", errno)
	}
	if _, _, _, errno := create(t, as(uidBob), e.root, "third", flags); errno != 0 {
		t.Errorf("Create by another uid under its own limit = %v", errno)
	}
	if n := liveCount(t, e.store); n != 3 {
		t.Errorf("%d live leases, want 3", n)
	}
}

// TestCreateIgnoresSpuriousInterrupt: go-fuse cancels a request's context
// when the kernel sends INTERRUPT, which Go clients cause spuriously
// (docs/ARCHITECTURE.md, kernel facts: honour cancellation only where the daemon really blocks).
// A reservation and a renewal do not block, so they must not fail, and
// never with EIO.
func TestCreateIgnoresSpuriousInterrupt(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	cancelled := make(chan struct{})
	close(cancelled)
	ctx := &fuse.Context{Caller: fuse.Caller{Owner: fuse.Owner{Uid: uidAlice, Gid: uidAlice}}, Cancel: cancelled}
	ino, h, _, errno := create(t, ctx, e.root, "intr", syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDWR)
	if errno != 0 {
		t.Fatalf("Create with an interrupted context = %v, want success", errno)
	}
	tok := readToken(t, ctx, h)
	if errno := write(ctx, h, tok); errno != 0 {
		t.Errorf("renew with an interrupted context = %v, want success", errno)
	}
	_ = ino
}

func TestUnlink(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	startRun(t, e.fsys)
	_, h := mustCreate(t, as(uidAlice), e.root, "u")
	l, _ := e.store.Live(context.Background(), "u")

	if errno := e.root.Unlink(as(uidBob), "u"); errno != syscall.EPERM {
		t.Errorf("Unlink by another uid = %v, want EPERM", errno)
	}
	if errno := e.root.Unlink(as(uidAlice), "u"); errno != 0 {
		t.Fatalf("Unlink by the holder = %v", errno)
	}
	got, err := e.store.Load(context.Background(), l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != leasecore.StatusComplete || got.CompletedAt.IsZero() {
		t.Errorf("after unlink: status %s completed_at %v, want complete", got.Status, got.CompletedAt)
	}
	// Run follows the end on the store's feed and forgets the token.
	waitUntil(t, "the unrevealed token of the unlinked lease to be forgotten", func() bool { return !hasToken(e.fsys, l.ID) })
	if _, errno := read(as(uidAlice), h, 4096, 0); errno != syscall.ESTALE {
		t.Errorf("read of the unlinked lease's handle = %v, want ESTALE", errno)
	}
	if errno := e.root.Unlink(as(uidAlice), "u"); errno != syscall.ENOENT {
		t.Errorf("second Unlink = %v, want ENOENT", errno)
	}
	if errno := e.root.Unlink(as(uidAlice), "missing"); errno != syscall.ENOENT {
		t.Errorf("Unlink of a missing name = %v, want ENOENT", errno)
	}
	// The name is free at once.
	mustCreate(t, as(uidBob), e.root, "u")
	// Root may release anyone's lease.
	if errno := e.root.Unlink(as(uidRoot), "u"); errno != 0 {
		t.Errorf("Unlink by root = %v", errno)
	}
}

func TestNamespaces(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	ctx := as(uidAlice)
	var out fuse.EntryOut
	nsIno, errno := e.root.Mkdir(ctx, "team", 0o755, &out)
	if errno != 0 {
		t.Fatalf("Mkdir: %v", errno)
	}
	if out.Attr.Mode != dirMode || out.Attr.Uid != uidAlice {
		t.Errorf("Mkdir attr mode %o uid %d, want %o %d", out.Attr.Mode, out.Attr.Uid, dirMode, uidAlice)
	}
	if _, errno := e.root.Mkdir(ctx, "team", 0o755, &out); errno != syscall.EEXIST {
		t.Errorf("second Mkdir = %v, want EEXIST", errno)
	}
	if _, errno := e.root.Mkdir(ctx, strings.Repeat("d", 256), 0o755, &out); errno != syscall.ENAMETOOLONG {
		t.Errorf("Mkdir of a long name = %v, want ENAMETOOLONG", errno)
	}
	team := nsIno.Operations().(*dirNode)
	leaseNodeIn, _ := mustCreate(t, as(uidBob), team, "job")
	mustCreate(t, ctx, e.root, "top")

	// Lookup finds both kinds.
	got, errno := e.root.Lookup(ctx, "team", &out)
	if errno != 0 || got.StableAttr().Mode != syscall.S_IFDIR || got.StableAttr().Ino != nsIno.StableAttr().Ino {
		t.Errorf("Lookup(team) = %v %v, want the namespace's inode", got, errno)
	}
	got, errno = team.Lookup(ctx, "job", &out)
	if errno != 0 || got.StableAttr().Ino != leaseNodeIn.StableAttr().Ino || out.Attr.Uid != uidBob {
		t.Errorf("Lookup(team/job) = %v %v uid %d", got, errno, out.Attr.Uid)
	}
	if _, errno := e.root.Lookup(ctx, "nothing", &out); errno != syscall.ENOENT {
		t.Errorf("Lookup(nothing) = %v, want ENOENT", errno)
	}
	if _, errno := e.root.Lookup(ctx, strings.Repeat("n", 256), &out); errno != syscall.ENAMETOOLONG {
		t.Errorf("Lookup(long) = %v, want ENAMETOOLONG", errno)
	}

	if names := readdir(t, ctx, e.root); !slices.Equal(names, []string{"team/", "top"}) {
		t.Errorf("Readdir(root) = %v", names)
	}
	if names := readdir(t, ctx, team); !slices.Equal(names, []string{"job"}) {
		t.Errorf("Readdir(team) = %v", names)
	}

	if errno := e.root.Rmdir(ctx, "team"); errno != syscall.ENOTEMPTY {
		t.Errorf("Rmdir of a namespace with a lease = %v, want ENOTEMPTY", errno)
	}
	if errno := e.root.Rmdir(ctx, "missing"); errno != syscall.ENOENT {
		t.Errorf("Rmdir(missing) = %v, want ENOENT", errno)
	}
	if errno := team.Unlink(as(uidBob), "job"); errno != 0 {
		t.Fatalf("Unlink(team/job): %v", errno)
	}
	if errno := e.root.Rmdir(ctx, "team"); errno != 0 {
		t.Fatalf("Rmdir of the empty namespace = %v", errno)
	}
	var aout fuse.AttrOut
	if errno := team.Getattr(ctx, nil, &aout); errno != syscall.ESTALE {
		t.Errorf("Getattr of a removed namespace = %v, want ESTALE", errno)
	}
	if _, errno := e.root.Lookup(ctx, "team", &out); errno != syscall.ENOENT {
		t.Errorf("Lookup of a removed namespace = %v, want ENOENT", errno)
	}
	again, errno := e.root.Mkdir(ctx, "team", 0o755, &out)
	if errno != 0 {
		t.Fatalf("Mkdir again: %v", errno)
	}
	if again.StableAttr().Ino == nsIno.StableAttr().Ino {
		t.Error("a re-created namespace reuses the old inode number")
	}
}

// readdir lists d without "." and "..", which it checks come first,
// marking directories with a trailing slash.
func readdir(t *testing.T, ctx context.Context, d *dirNode) []string {
	t.Helper()
	ds, errno := d.Readdir(ctx)
	if errno != 0 {
		t.Fatalf("Readdir: %v", errno)
	}
	for _, dot := range []string{".", ".."} {
		if de, errno := ds.Next(); errno != 0 || de.Name != dot || de.Mode != syscall.S_IFDIR {
			t.Fatalf("Readdir entry = %+v, %v; want %q first", de, errno, dot)
		}
	}
	var names []string
	for ds.HasNext() {
		de, errno := ds.Next()
		if errno != 0 {
			t.Fatalf("Readdir Next: %v", errno)
		}
		if de.Ino == 0 {
			t.Errorf("entry %q without an inode number", de.Name)
		}
		if de.Mode == syscall.S_IFDIR {
			de.Name += "/"
		}
		names = append(names, de.Name)
	}
	return names
}

func TestRootAttrs(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	ctx := as(uidBob)
	var aout fuse.AttrOut
	if errno := e.root.Getattr(ctx, nil, &aout); errno != 0 {
		t.Fatal(errno)
	}
	if aout.Ino != fuse.FUSE_ROOT_ID || aout.Mode != dirMode {
		t.Errorf("root ino %d mode %o, want 1 %o", aout.Ino, aout.Mode, dirMode)
	}
	// No attribute cache, not even of the root's fixed attributes: stat of
	// the mountpoint must fail with ENOTCONN once the daemon is gone.
	if aout.Timeout() != 0 {
		t.Errorf("root attribute timeout %v, want 0", aout.Timeout())
	}
	touch := &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{Valid: fuse.FATTR_MTIME | fuse.FATTR_MTIME_NOW}}
	if errno := e.root.Setattr(ctx, nil, touch, &aout); errno != 0 {
		t.Errorf("touch on the root = %v", errno)
	}
	chmod := &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{Valid: fuse.FATTR_MODE, Mode: 0o700}}
	if errno := e.root.Setattr(ctx, nil, chmod, &aout); errno != syscall.EPERM {
		t.Errorf("chmod on the root = %v, want EPERM", errno)
	}
	var st fuse.StatfsOut
	if errno := e.root.Statfs(ctx, &st); errno != 0 || st.NameLen != 255 {
		t.Errorf("Statfs = %v namelen %d", errno, st.NameLen)
	}
}

func TestRefusedDirOps(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	ctx := as(uidAlice)
	n, _ := mustCreate(t, ctx, e.root, "a")
	var out fuse.EntryOut
	checks := map[string]syscall.Errno{
		"rename":  e.root.Rename(ctx, "a", e.root, "b", 0),
		"link":    second(e.root.Link(ctx, n, "b", &out)),
		"symlink": second(e.root.Symlink(ctx, "a", "b", &out)),
		"mknod":   second(e.root.Mknod(ctx, "b", syscall.S_IFIFO|0o644, 0, &out)),
	}
	for op, errno := range checks {
		if errno != syscall.EPERM {
			t.Errorf("%s = %v, want EPERM", op, errno)
		}
	}
	if n := liveCount(t, e.store); n != 1 {
		t.Errorf("%d live leases after refused operations, want 1", n)
	}
	if l, err := e.store.Live(context.Background(), "a"); err != nil || l.ID != n.id {
		t.Errorf("lease a changed: %v %v", l.ID, err)
	}
	if _, err := e.store.Live(context.Background(), "b"); !errors.Is(err, leasecore.ErrNotFound) {
		t.Errorf("name b exists after refused operations: %v", err)
	}
	if _, errno := e.root.Getxattr(ctx, "user.lease.status", nil); errno != syscall.ENODATA {
		t.Errorf("Getxattr on a directory = %v, want ENODATA", errno)
	}
	if sz, errno := e.root.Listxattr(ctx, nil); errno != 0 || sz != 0 {
		t.Errorf("Listxattr on a directory = %d %v", sz, errno)
	}
	if errno := e.root.Setxattr(ctx, "user.lease.status", []byte("complete"), 0); errno != syscall.EPERM {
		t.Errorf("Setxattr on a directory = %v, want EPERM", errno)
	}
	if errno := e.root.Removexattr(ctx, "user.lease.status"); errno != syscall.EPERM {
		t.Errorf("Removexattr on a directory = %v, want EPERM", errno)
	}
}

func second(_ *fs.Inode, errno syscall.Errno) syscall.Errno { return errno }
