package fusefs

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/leasecore"
)

// statusOf reads the status document through a fresh read at offset 0 of h
// and decodes it.
func statusOf(t *testing.T, ctx context.Context, h *leaseHandle) map[string]any {
	t.Helper()
	doc := readDoc(t, ctx, h, 4096)
	var m map[string]any
	if _, err := toml.Decode(string(doc), &m); err != nil {
		t.Fatalf("status document does not parse: %v\n%s", err, doc)
	}
	return m
}

func TestWriteRenew(t *testing.T) {
	e := newEnv(t, leasecore.Options{LeaseDuration: time.Minute})
	ctx := as(uidAlice)
	n, h := mustCreate(t, ctx, e.root, "w")
	tok := readToken(t, ctx, h)
	before, _ := e.store.Load(context.Background(), n.id)

	for i, payload := range []string{tok, tok + "\n", tok + "\r\n", "token = \"" + tok + "\"\naction = \"renew\"\n"} {
		e.clock.Advance(40 * time.Second) // would expire without the renewals
		if errno := write(ctx, h, payload); errno != 0 {
			t.Fatalf("renew %d (%q): %v", i, payload, errno)
		}
		l, err := e.store.Load(context.Background(), n.id)
		if err != nil || !l.Live() {
			t.Fatalf("after renew %d: %v status %s", i, err, l.Status)
		}
		if !l.HeartbeatAt.Equal(e.clock.Now()) || !l.HeartbeatAt.After(before.HeartbeatAt) {
			t.Errorf("renew %d: heartbeat %v, want now %v", i, l.HeartbeatAt, e.clock.Now())
		}
		if !l.ExpiresAt.Equal(l.HeartbeatAt.Add(time.Minute)) {
			t.Errorf("renew %d: expires %v, want heartbeat + 1m", i, l.ExpiresAt)
		}
	}

	// Renew with annotations; the holder process is this one.
	pid := os.Getpid()
	payload := "token = \"" + tok + "\"\nclient = \"go test\"\nactor_session_id = \"s-1\"\npid = " + strconv.Itoa(pid) + "\n"
	if errno := write(ctx, h, payload); errno != 0 {
		t.Fatalf("renew with annotations: %v", errno)
	}
	st := statusOf(t, ctx, h)
	if st["client"] != "go test" || st["actor_session_id"] != "s-1" || st["pid"] != int64(pid) {
		t.Errorf("status after annotated renew: %v", st)
	}
	var aout fuse.AttrOut
	if errno := n.Getattr(ctx, nil, &aout); errno != 0 {
		t.Fatal(errno)
	}
	if got := time.Unix(int64(aout.Mtime), int64(aout.Mtimensec)); !got.Equal(e.clock.Now()) {
		t.Errorf("st_mtime %v, want the last heartbeat %v", got, e.clock.Now())
	}
	if aout.Size != uint64(len(readDoc(t, ctx, h, 4096))) {
		t.Errorf("st_size %d, want the status document's length", aout.Size)
	}
}

func TestWriteRefused(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	ctx := as(uidAlice)
	n, h := mustCreate(t, ctx, e.root, "w")
	tok := readToken(t, ctx, h)
	before, _ := e.store.Load(context.Background(), n.id)
	e.clock.Advance(time.Second)

	other := leasecore.NewToken()
	tests := []struct {
		name    string
		ctx     context.Context
		payload string
		want    syscall.Errno
	}{
		{"wrong token", ctx, other, syscall.EACCES},
		{"wrong token TOML", ctx, "token = \"" + other + "\"\naction = \"complete\"\n", syscall.EACCES},
		{"malformed", ctx, "hello", syscall.EINVAL},
		{"unknown action", ctx, "token = \"" + tok + "\"\naction = \"steal\"\n", syscall.EINVAL},
		{"empty", ctx, "\n", syscall.EINVAL},
		{"too big", ctx, tok + strings.Repeat("\n", MaxPayload), syscall.EFBIG},
		{"non-holder with the token", as(uidBob), tok, syscall.EACCES},
		{"non-holder complete", as(uidBob), "token = \"" + tok + "\"\naction = \"complete\"\n", syscall.EACCES},
		{"dead pid annotation", ctx, "token = \"" + tok + "\"\npid = " + strconv.Itoa(1<<22) + "\n", syscall.EINVAL},
	}
	for _, tt := range tests {
		if errno := write(tt.ctx, h, tt.payload); errno != tt.want {
			t.Errorf("%s: Write = %v, want %v", tt.name, errno, tt.want)
		}
	}
	after, err := e.store.Load(context.Background(), n.id)
	if err != nil || !after.Live() || !after.HeartbeatAt.Equal(before.HeartbeatAt) || after.PID != 0 {
		t.Errorf("refused writes changed the lease: %+v (err %v)", after, err)
	}
	// Exactly MaxPayload bytes is accepted.
	if errno := write(ctx, h, tok+strings.Repeat("\n", MaxPayload-len(tok))); errno != 0 {
		t.Errorf("Write of exactly MaxPayload bytes = %v", errno)
	}
	// Root may renew with the token.
	if errno := write(as(uidRoot), h, tok); errno != 0 {
		t.Errorf("renew by root = %v", errno)
	}
}

func TestWriteTakeover(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	n, aliceH := mustCreate(t, as(uidAlice), e.root, "t")
	tok := readToken(t, as(uidAlice), aliceH)

	// Bob cannot open the lease for writing (EACCES, see TestCreateOnHeldName);
	// the handle-level rule is that a takeover needs no token.
	_, bobH, _, errno := create(t, as(uidBob), e.root, "t", syscall.O_CREAT|syscall.O_RDONLY)
	if errno != 0 {
		t.Fatal(errno)
	}
	e.clock.Advance(time.Second)
	if errno := write(as(uidBob), bobH, "takeover\n"); errno != 0 {
		t.Fatalf("takeover by another uid = %v", errno)
	}
	st := statusOf(t, as(uidBob), bobH)
	if by, _ := st["takeover_requested_by"].(string); !strings.Contains(by, "uid 1001") {
		t.Errorf("takeover_requested_by = %v, want uid 1001", st["takeover_requested_by"])
	}
	if _, ok := st["takeover_requested_at"]; !ok {
		t.Error("takeover_requested_at missing")
	}
	if errno := write(as(uidBob), bobH, "action = \"takeover\"\nreason = \"build 7 is stuck\"\n"); errno != 0 {
		t.Fatalf("takeover with reason = %v", errno)
	}
	l, _ := e.store.Load(context.Background(), n.id)
	if l.TakeoverReason != "build 7 is stuck" || !l.Live() || l.HolderUID != uidAlice {
		t.Errorf("after takeover: reason %q live %v holder %d", l.TakeoverReason, l.Live(), l.HolderUID)
	}
	// A takeover changes nothing else: the holder's token still renews.
	if errno := write(as(uidAlice), aliceH, tok); errno != 0 {
		t.Errorf("holder renew after takeover = %v", errno)
	}
}

func TestWriteEndsLease(t *testing.T) {
	for _, tc := range []struct {
		action string
		want   leasecore.Status
	}{
		{"complete", leasecore.StatusComplete},
		{"abandon", leasecore.StatusAbandoned},
	} {
		t.Run(tc.action, func(t *testing.T) {
			e := newEnv(t, leasecore.Options{})
			ctx := as(uidAlice)
			n, h := mustCreate(t, ctx, e.root, "end")
			tok := readToken(t, ctx, h)
			if errno := write(ctx, h, "token = \""+tok+"\"\naction = \""+tc.action+"\"\n"); errno != 0 {
				t.Fatalf("%s: %v", tc.action, errno)
			}
			l, _ := e.store.Load(context.Background(), n.id)
			if l.Status != tc.want {
				t.Errorf("status %s, want %s", l.Status, tc.want)
			}
			if _, errno := read(ctx, h, 4096, 0); errno != syscall.ESTALE {
				t.Errorf("read after %s = %v, want ESTALE", tc.action, errno)
			}
			if errno := write(ctx, h, tok); errno != syscall.ESTALE {
				t.Errorf("write after %s = %v, want ESTALE", tc.action, errno)
			}
			if errno := write(as(uidBob), h, "takeover"); errno != syscall.ESTALE {
				t.Errorf("takeover after %s = %v, want ESTALE", tc.action, errno)
			}
			// The name is free at once; the old handle stays bound to the
			// ended lease.
			mustCreate(t, as(uidBob), e.root, "end")
			if _, errno := read(ctx, h, 4096, 0); errno != syscall.ESTALE {
				t.Errorf("read of the old handle after re-reserve = %v, want ESTALE", errno)
			}
		})
	}
}

func TestExpiry(t *testing.T) {
	e := newEnv(t, leasecore.Options{LeaseDuration: time.Minute})
	ctx := as(uidAlice)
	n, h := mustCreate(t, ctx, e.root, "exp")
	oldIno := n.StableAttr().Ino

	e.clock.Advance(59 * time.Second)
	var aout fuse.AttrOut
	if errno := n.Getattr(ctx, nil, &aout); errno != 0 {
		t.Fatalf("Getattr before expiry = %v", errno)
	}
	e.clock.Advance(time.Second)

	// fstat never answers ESTALE: the ended lease, unlinked (docs/PROTOCOL.md §3).
	if errno := n.Getattr(ctx, nil, &aout); errno != 0 || aout.Nlink != 0 || aout.Ino != oldIno {
		t.Errorf("Getattr after expiry = %v, nlink %d, ino %d; want the ended lease: nlink 0, ino %d", errno, aout.Nlink, aout.Ino, oldIno)
	}
	if _, errno := read(ctx, h, 4096, 0); errno != syscall.ESTALE {
		t.Errorf("Read after expiry = %v, want ESTALE", errno)
	}
	if _, _, errno := n.Open(ctx, syscall.O_RDONLY); errno != syscall.ESTALE {
		t.Errorf("Open after expiry = %v, want ESTALE", errno)
	}
	var out fuse.EntryOut
	if _, errno := e.root.Lookup(ctx, "exp", &out); errno != syscall.ENOENT {
		t.Errorf("Lookup after expiry = %v, want ENOENT", errno)
	}
	l, _ := e.store.Load(context.Background(), n.id)
	if l.Status != leasecore.StatusAbandoned {
		t.Errorf("expired lease status %s, want abandoned", l.Status)
	}
	if names := readdir(t, ctx, e.root); len(names) != 0 {
		t.Errorf("Readdir after expiry = %v", names)
	}

	n2, h2 := mustCreate(t, as(uidBob), e.root, "exp")
	if n2.StableAttr().Ino == oldIno {
		t.Errorf("re-reserved name reuses inode %d", oldIno)
	}
	readToken(t, as(uidBob), h2)
	if _, errno := read(ctx, h, 4096, 0); errno != syscall.ESTALE {
		t.Errorf("old handle after re-reserve = %v, want ESTALE", errno)
	}
	if errno := n.Getattr(ctx, nil, &aout); errno != 0 || aout.Nlink != 0 || aout.Uid != uidAlice {
		t.Errorf("old node after re-reserve = %v, nlink %d, uid %d; want alice's ended lease, nlink 0", errno, aout.Nlink, aout.Uid)
	}
	var sout fuse.AttrOut
	in := &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{Valid: fuse.FATTR_SIZE}}
	if errno := n.Setattr(ctx, h, in, &sout); errno != 0 || sout.Nlink != 0 {
		t.Errorf("ftruncate(0) through the ended lease's handle = %v, nlink %d; want a no-op, nlink 0", errno, sout.Nlink)
	}
	if errno := n.Setattr(as(uidBob), h, in, &sout); errno != syscall.EPERM {
		t.Errorf("truncate of alice's ended lease by bob = %v, want EPERM", errno)
	}
}

func TestOpen(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	n, _ := mustCreate(t, as(uidAlice), e.root, "o")
	for _, tc := range []struct {
		uid   uint32
		flags uint32
		want  syscall.Errno
	}{
		{uidAlice, syscall.O_RDONLY, 0},
		{uidAlice, syscall.O_WRONLY, 0},
		{uidAlice, syscall.O_RDWR, 0},
		{uidBob, syscall.O_RDONLY, 0},
		{uidBob, syscall.O_WRONLY, syscall.EACCES},
		{uidBob, syscall.O_RDWR, syscall.EACCES},
		{uidRoot, syscall.O_RDWR, 0},
	} {
		fh, flags, errno := n.Open(as(tc.uid), tc.flags)
		if errno != tc.want {
			t.Errorf("uid %d flags %#o: Open = %v, want %v", tc.uid, tc.flags, errno, tc.want)
			continue
		}
		if errno == 0 && (flags&fuse.FOPEN_DIRECT_IO == 0 || fh.(*leaseHandle).leaseID() != n.id) {
			t.Errorf("uid %d: Open flags %#x handle %+v", tc.uid, flags, fh)
		}
	}
}

func TestSetattr(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	n, h := mustCreate(t, as(uidAlice), e.root, "s")
	set := func(valid uint32, size uint64, mode uint32) *fuse.SetAttrIn {
		return &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{Valid: valid, Size: size, Mode: mode}}
	}
	tests := []struct {
		name string
		uid  uint32
		in   *fuse.SetAttrIn
		want syscall.Errno
	}{
		{"truncate by holder", uidAlice, set(fuse.FATTR_SIZE, 0, 0), 0},
		{"truncate with fh by holder", uidAlice, set(fuse.FATTR_SIZE|fuse.FATTR_FH, 0, 0), 0},
		{"touch by holder", uidAlice, set(fuse.FATTR_ATIME|fuse.FATTR_MTIME|fuse.FATTR_ATIME_NOW|fuse.FATTR_MTIME_NOW, 0, 0), 0},
		{"touch by root", uidRoot, set(fuse.FATTR_MTIME, 0, 0), 0},
		{"truncate by other", uidBob, set(fuse.FATTR_SIZE, 0, 0), syscall.EPERM},
		{"touch by other", uidBob, set(fuse.FATTR_MTIME|fuse.FATTR_MTIME_NOW, 0, 0), syscall.EPERM},
		{"chmod by holder", uidAlice, set(fuse.FATTR_MODE, 0, 0o600), syscall.EPERM},
		{"chown by holder", uidAlice, set(fuse.FATTR_UID, 0, 0), syscall.EPERM},
		{"chgrp by root", uidRoot, set(fuse.FATTR_GID, 0, 0), syscall.EPERM},
		{"size 5 by holder", uidAlice, set(fuse.FATTR_SIZE, 5, 0), syscall.EPERM},
	}
	for _, tt := range tests {
		var out fuse.AttrOut
		errno := n.Setattr(as(tt.uid), h, tt.in, &out)
		if errno != tt.want {
			t.Errorf("%s: Setattr = %v, want %v", tt.name, errno, tt.want)
		}
		if errno == 0 && (out.Ino != n.StableAttr().Ino || out.Uid != uidAlice || out.Mode != syscall.S_IFREG|0o644) {
			t.Errorf("%s: attr ino %d uid %d mode %o", tt.name, out.Ino, out.Uid, out.Mode)
		}
	}
	// Truncation is a no-op: the token is still unrevealed and the lease live.
	readToken(t, as(uidAlice), h)
	if l, err := e.store.Live(context.Background(), "s"); err != nil || l.ID != n.id {
		t.Errorf("lease changed by setattr: %v", err)
	}
}

func TestXattrs(t *testing.T) {
	e := newEnv(t, leasecore.Options{})
	ctx := as(uidBob) // status fields are world-readable
	n, _ := mustCreate(t, as(uidAlice), e.root, "x")

	getx := func(name string, size int) (string, syscall.Errno) {
		buf := make([]byte, size)
		sz, errno := n.Getxattr(ctx, name, buf)
		if errno != 0 || size == 0 {
			return strconv.Itoa(int(sz)), errno
		}
		return string(buf[:sz]), 0
	}
	if v, errno := getx("user.lease.status", 64); errno != 0 || v != "active" {
		t.Errorf("user.lease.status = %q %v, want active", v, errno)
	}
	if v, errno := getx("user.lease.resource", 64); errno != 0 || v != "x" {
		t.Errorf("user.lease.resource = %q %v, want x (unquoted)", v, errno)
	}
	if v, errno := getx("user.lease.status", 0); errno != 0 || v != "6" {
		t.Errorf("size probe of user.lease.status = %s %v, want 6", v, errno)
	}
	if _, errno := getx("user.lease.status", 3); errno != syscall.ERANGE {
		t.Errorf("user.lease.status into 3 bytes = %v, want ERANGE", errno)
	}
	for _, name := range []string{"user.lease.nope", "user.other", "security.selinux", "user.lease.token", "user.lease.token_hash"} {
		if _, errno := getx(name, 64); errno != syscall.ENODATA {
			t.Errorf("%s = %v, want ENODATA", name, errno)
		}
	}

	sz, errno := n.Listxattr(ctx, nil)
	if errno != 0 || sz == 0 {
		t.Fatalf("Listxattr size probe = %d %v", sz, errno)
	}
	buf := make([]byte, sz)
	if got, errno := n.Listxattr(ctx, buf); errno != 0 || got != sz {
		t.Fatalf("Listxattr = %d %v, want %d", got, errno, sz)
	}
	names := strings.Split(strings.TrimSuffix(string(buf), "\x00"), "\x00")
	for _, want := range []string{"user.lease.resource", "user.lease.status", "user.lease.generation", "user.lease.holder_uid"} {
		if !slices.Contains(names, want) {
			t.Errorf("Listxattr = %q lacks %s", names, want)
		}
	}
	for _, name := range names {
		if _, errno := getx(name, 4096); errno != 0 {
			t.Errorf("listed %s but Getxattr = %v", name, errno)
		}
	}
	if _, errno := n.Listxattr(ctx, make([]byte, 4)); errno != syscall.ERANGE {
		t.Errorf("Listxattr into 4 bytes = %v, want ERANGE", errno)
	}
	if bytes.Contains(buf, []byte("token")) {
		t.Errorf("Listxattr names a token field: %q", names)
	}

	for _, uid := range []uint32{uidAlice, uidBob, uidRoot} {
		if errno := n.Setxattr(as(uid), "user.lease.status", []byte("complete"), 0); errno != syscall.EPERM {
			t.Errorf("uid %d: Setxattr = %v, want EPERM", uid, errno)
		}
		if errno := n.Removexattr(as(uid), "user.lease.status"); errno != syscall.EPERM {
			t.Errorf("uid %d: Removexattr = %v, want EPERM", uid, errno)
		}
	}

	if errno := e.root.Unlink(as(uidAlice), "x"); errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := getx("user.lease.status", 64); errno != syscall.ESTALE {
		t.Errorf("Getxattr after release = %v, want ESTALE", errno)
	}
}
