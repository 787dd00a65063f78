package fusefs

import (
	"context"
	"fmt"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/leasecore"
)

// leaseHandle is one open file description of a lease file, bound to the
// lease it was opened on (SPEC §3).
type leaseHandle struct {
	fsys     *FS
	id       string
	resource string
	// reserved is true for the handle whose create reserved the lease.
	reserved bool

	mu sync.Mutex
	// snap is what this handle reads: the token or a status document,
	// captured at the read at offset 0 so that chunked reads see one
	// consistent document.
	snap []byte
}

var (
	_ = (fs.FileReader)((*leaseHandle)(nil))
	_ = (fs.FileWriter)((*leaseHandle)(nil))
	_ = (fs.FileFlusher)((*leaseHandle)(nil))
	_ = (fs.FileFsyncer)((*leaseHandle)(nil))
	_ = (fs.FileGetlker)((*leaseHandle)(nil))
	_ = (fs.FileSetlker)((*leaseHandle)(nil))
	_ = (fs.FileSetlkwer)((*leaseHandle)(nil))
)

func newHandle(f *FS, l leasecore.Lease, reserved bool) *leaseHandle {
	return &leaseHandle{fsys: f, id: l.ID, resource: l.Resource, reserved: reserved}
}

// live returns the handle's lease if it is still live, ESTALE otherwise.
func (h *leaseHandle) live(ctx context.Context) (leasecore.Lease, syscall.Errno) {
	l, err := h.fsys.store.Load(ctx, h.id)
	if err != nil {
		return l, toErrno(err)
	}
	if !l.Live() {
		return l, syscall.ESTALE
	}
	return l, 0
}

// Read returns, for the first read after the reservation by the holder uid
// (or root), exactly the token and a newline; otherwise the status document
// (SPEC §3, §4.1). Errors: ESTALE once the handle's lease has ended.
func (h *leaseHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	c := callerOf(ctx)
	l, errno := h.live(ctx)
	if errno != 0 {
		return nil, h.fsys.refuse("read", h.resource, c, errno, "lease ended")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if off == 0 || h.snap == nil {
		h.snap = nil
		if c.mayHold(l) {
			if tok, ok := h.fsys.takeToken(l.ID); ok {
				h.snap = []byte(tok + "\n")
			}
		}
		if h.snap == nil {
			h.snap = leasecore.StatusDocument(l, 0)
		}
	}
	if off >= int64(len(h.snap)) {
		return fuse.ReadResultData(nil), 0
	}
	end := min(off+int64(len(dest)), int64(len(h.snap)))
	return fuse.ReadResultData(h.snap[off:end]), 0
}

// Write carries one command (SPEC §4.2): a token renews, a TOML command
// renews with annotations, completes, abandons or requests a takeover.
// Errors: EFBIG over [MaxPayload]; EINVAL for a malformed payload; ESTALE
// when the handle's lease has ended; EACCES for a wrong token or a caller
// that is not the holder uid; ENOSPC/EIO when the store cannot persist.
func (h *leaseHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	c := callerOf(ctx)
	if len(data) > MaxPayload {
		return 0, h.fsys.refuse("write", h.resource, c, syscall.EFBIG, fmt.Sprintf("payload of %d bytes exceeds %d", len(data), MaxPayload))
	}
	cmd, err := parsePayload(data)
	if err != nil {
		return 0, h.fsys.refuse("write", h.resource, c, syscall.EINVAL, err)
	}
	l, errno := h.live(ctx)
	if errno != 0 {
		return 0, h.fsys.refuse("write", h.resource, c, errno, "lease ended")
	}
	if cmd.action != actionTakeover && !c.mayHold(l) {
		return 0, h.fsys.refuse("write", h.resource, c, syscall.EACCES, "not the holder uid")
	}
	switch cmd.action {
	case actionRenew:
		_, err = h.fsys.store.Renew(ctx, h.id, cmd.token, cmd.ann)
	case actionComplete, actionAbandon:
		status := leasecore.StatusComplete
		if cmd.action == actionAbandon {
			status = leasecore.StatusAbandoned
		}
		var ended leasecore.Lease
		if ended, err = h.fsys.store.Release(ctx, h.id, cmd.token, status); err == nil {
			h.fsys.ended(ended)
			h.fsys.log.Info("released", "resource", h.resource, "lease", h.id, "status", status, "uid", c.uid, "pid", c.pid)
		}
	case actionTakeover:
		by := fmt.Sprintf("uid %d pid %d", c.uid, c.pid)
		_, err = h.fsys.store.RequestTakeover(ctx, h.id, leasecore.TakeoverRequest{By: by, Reason: cmd.reason})
	}
	if err != nil {
		return 0, h.fsys.refuse("write", h.resource, c, toErrno(err), err)
	}
	return uint32(len(data)), 0
}

// Flush does nothing: FLUSH comes for every close() of every descriptor and
// never ends a lease (FUSE-NOTES.md, SPEC §6).
func (h *leaseHandle) Flush(ctx context.Context) syscall.Errno { return 0 }

// Fsync does nothing: every change is durable before its write returns.
func (h *leaseHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno { return 0 }

// Getlk refuses lock queries with ENOLCK until handle leases exist: a lock
// must never be silently local to the kernel (SPEC §6, §9).
func (h *leaseHandle) Getlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32, out *fuse.FileLock) syscall.Errno {
	return h.fsys.refuse("getlk", h.resource, callerOf(ctx), syscall.ENOLCK, "locks on lease files are not supported yet")
}

// Setlk refuses flock and fcntl locks with ENOLCK (see Getlk).
func (h *leaseHandle) Setlk(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.fsys.refuse("setlk", h.resource, callerOf(ctx), syscall.ENOLCK, "locks on lease files are not supported yet")
}

// Setlkw refuses blocking flock and fcntl locks with ENOLCK (see Getlk).
func (h *leaseHandle) Setlkw(ctx context.Context, owner uint64, lk *fuse.FileLock, flags uint32) syscall.Errno {
	return h.fsys.refuse("setlkw", h.resource, callerOf(ctx), syscall.ENOLCK, "locks on lease files are not supported yet")
}
