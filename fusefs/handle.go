package fusefs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/leasecore"
)

// leaseHandle is one open file description of a lease file, bound to the
// lease it was opened on (docs/PROTOCOL.md §3).
type leaseHandle struct {
	fsys     *FS
	node     *leaseNode // the inode the file was opened on
	resource string

	mu sync.Mutex
	// id is the lease this open file refers to. It changes only when a
	// flock or fcntl lock acquires the name for this open file (docs/PROTOCOL.md §6).
	id string
	// reserved is true for the handle whose create reserved the lease;
	// authenticated once a write on it presented the lease's token. Either
	// makes this open file a credential that a lock may bind (docs/PROTOCOL.md §6).
	reserved, authenticated bool
	// bound is true while this open file holds its lease by flock: the
	// lease ends when the lock is released or the open file is.
	bound bool
	// bindUnknown is set when binding the reserved lease to a lock failed
	// with its outcome unknown: the store may hold it as a handle lease
	// that no open file holds, which [leaseHandle.dropUnclaimed] ends.
	bindUnknown bool
	// unlocked is the handle lease that this open file's own unlock ended
	// (flock LOCK_UN, or fcntl F_UNLCK through it): a note that arrives
	// after it, flushed at the close, is accepted and changes nothing
	// (docs/PROTOCOL.md §4.2, "Notes").
	unlocked string
	// posixKeys are the fcntl lock owners that took a lease through this
	// open file. A process-owned (POSIX) lock ends at the owner's FLUSH;
	// an open-file-owned one (F_OFD_SETLK) only when the open file is
	// released, so Release ends what is left of them.
	posixKeys []posixKey
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
	_ = (fs.FileReleaser)((*leaseHandle)(nil))
	_ = (fs.FileGetlker)((*leaseHandle)(nil))
	_ = (fs.FileSetlker)((*leaseHandle)(nil))
	_ = (fs.FileSetlkwer)((*leaseHandle)(nil))
)

// newHandle opens lease l on node n; reserved marks the open file whose
// create reserved l.
func (n *leaseNode) newHandle(l leasecore.Lease, reserved bool) *leaseHandle {
	h := &leaseHandle{fsys: n.fsys, node: n, id: l.ID, resource: l.Resource, reserved: reserved}
	n.mu.Lock()
	if n.handles == nil {
		n.handles = make(map[*leaseHandle]struct{})
	}
	n.handles[h] = struct{}{}
	n.mu.Unlock()
	return h
}

// leaseID returns the lease the handle refers to now.
func (h *leaseHandle) leaseID() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.id
}

// lease returns the handle's lease: ESTALE with the lease as it ended once
// it has (as the node knows it, should the store no longer keep it).
func (h *leaseHandle) lease(ctx context.Context) (leasecore.Lease, syscall.Errno) {
	l, err := h.fsys.store.Load(ctx, h.leaseID())
	switch {
	case errors.Is(err, leasecore.ErrNotFound):
		return h.node.ended(), syscall.ESTALE
	case err != nil:
		return l, toErrno(err)
	case !l.Live():
		return l, syscall.ESTALE
	}
	return l, 0
}

// live returns the handle's lease if it is still live, ESTALE otherwise.
// A call of the lease's holder waits while the lease is in jeopardy
// ([FS.awaitKept]; EINTR when interrupted meanwhile).
func (h *leaseHandle) live(ctx context.Context, op string, c caller) (leasecore.Lease, syscall.Errno) {
	for {
		l, err := h.fsys.store.Load(ctx, h.leaseID())
		if err != nil {
			return l, toErrno(err)
		}
		if !l.Live() {
			return l, syscall.ESTALE
		}
		if waited, errno := h.fsys.awaitKept(ctx, op, c, l); !waited || errno != 0 {
			return l, errno
		}
	}
}

// Read returns, for the first read after the reservation by the holder uid
// (or root), exactly the token and a newline; otherwise the status document
// (docs/PROTOCOL.md §3, §4.1). Errors: ESTALE once the handle's lease has ended.
func (h *leaseHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	c := callerOf(ctx)
	l, errno := h.live(ctx, "read", c)
	if errno == syscall.EINTR {
		return nil, errno
	}
	if errno != 0 {
		return nil, h.fsys.refuse("read", h.resource, c, errno, "lease ended")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if off == 0 || h.snap == nil {
		h.snap = nil
		// The token is revealed only to a read from offset 0, so that it is
		// always delivered whole.
		if off == 0 && c.mayHold(l) {
			if tok, ok := h.fsys.tokens.take(l.ID); ok {
				h.snap = []byte(tok + "\n")
			}
		}
		if h.snap == nil {
			h.snap = leasecore.StatusDocument(l)
		}
	}
	if off >= int64(len(h.snap)) {
		return fuse.ReadResultData(nil), 0
	}
	end := min(off+int64(len(dest)), int64(len(h.snap)))
	return fuse.ReadResultData(h.snap[off:end]), 0
}

// Write carries one command (docs/PROTOCOL.md §4.2): a token renews, a TOML command
// renews with annotations, completes, abandons or requests a takeover.
// Other text, through an open file that holds a handle lease by a lock, is
// the holder's note (§4.2, "Notes": see note, lateNote).
// Errors: EFBIG over [MaxPayload]; EINVAL for a malformed payload; ESTALE
// when the handle's lease has ended, or for a token or takeover written
// through the open that has just reserved the free name; EACCES for a
// wrong token or a caller that is not the holder uid; ENOSPC/EIO when the
// store cannot persist. A refused write through the open that reserved the
// name, its token still unread, also ends that reservation, so that
// nothing is left held (docs/PROTOCOL.md §3, "Choices").
func (h *leaseHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, errno := h.write(ctx, data)
	if errno != 0 && errno != syscall.EINTR {
		h.dropUnclaimed()
	}
	return n, errno
}

// write is Write without the cleanup of a refusal.
func (h *leaseHandle) write(ctx context.Context, data []byte) (uint32, syscall.Errno) {
	c := callerOf(ctx)
	if len(data) > MaxPayload {
		return 0, h.fsys.refuse("write", h.resource, c, syscall.EFBIG, fmt.Sprintf("payload of %d bytes exceeds %d", len(data), MaxPayload))
	}
	cmd, err := parsePayload(data)
	if err != nil {
		if !payloadLike(data) {
			l, holds, err := h.lockedLease(ctx)
			switch {
			case err != nil:
				return 0, h.fsys.refuse("write", h.resource, c, toErrno(err), err)
			case holds && l.Live():
				return h.note(ctx, c, l, data)
			case holds:
				// Ended by another (an rm, a takeover, a lost etcd
				// session): the holder learns that it lost its lease.
				return 0, h.fsys.refuse("write", h.resource, c, syscall.ESTALE, "the lease this open file held by its lock has ended")
			}
			if h.lateNote(ctx, data) {
				h.fsys.log.Debug("note after the holder's own unlock, discarded", "resource", h.resource, "uid", c.uid, "pid", c.logPID())
				return uint32(len(data)), 0
			}
		}
		return 0, h.fsys.refuse("write", h.resource, c, syscall.EINVAL, err)
	}
	l, errno := h.live(ctx, "write", c)
	if errno == syscall.EINTR {
		return 0, errno
	}
	if errno != 0 {
		return 0, h.fsys.refuse("write", h.resource, c, errno, "lease ended")
	}
	if cmd.action != actionTakeover && !c.mayHold(l) {
		return 0, h.fsys.refuse("write", h.resource, c, syscall.EACCES, "not the holder uid")
	}
	if cmd.action == actionTakeover && h.dropUnclaimed() {
		// `printf takeover >| name` on a free name: the O_CREAT of >|
		// reserved it for the writer, so there is no one to take over from.
		return 0, h.fsys.refuse("write", h.resource, c, syscall.ESTALE,
			"takeover of a name that had no live lease; the reservation this open made is released")
	}
	switch cmd.action {
	case actionRenew:
		if _, err = h.fsys.store.Renew(ctx, l.ID, cmd.token, cmd.ann); err == nil {
			h.mu.Lock()
			h.authenticated = h.authenticated || h.id == l.ID
			h.mu.Unlock()
		}
	case actionComplete, actionAbandon:
		status := leasecore.StatusComplete
		if cmd.action == actionAbandon {
			status = leasecore.StatusAbandoned
		}
		if _, err = h.fsys.store.Release(ctx, l.ID, cmd.token, status, cmd.ann); err == nil {
			h.fsys.log.Debug("released", "resource", h.resource, "lease", l.ID, "status", status, "uid", c.uid, "pid", c.logPID())
		}
	case actionTakeover:
		by := fmt.Sprintf("uid %d pid %d", c.uid, c.pid())
		_, err = h.fsys.store.RequestTakeover(ctx, l.ID, leasecore.TakeoverRequest{By: by, Reason: cmd.reason})
	}
	if errors.Is(err, leasecore.ErrTokenMismatch) && h.dropUnclaimed() {
		// The writer opened a free name with O_CREAT to renew a lease
		// (`echo "$tok" >| name`): the name had no live lease, so whatever
		// lease the token was for, if any, has ended, and the reservation
		// the open made is nobody's. The store keeps no way to tell an
		// ended lease's token from a mistyped one; either way the caller
		// holds nothing here, which ESTALE says (docs/PROTOCOL.md §3,
		// "Choices").
		return 0, h.fsys.refuse("write", h.resource, c, syscall.ESTALE,
			"the name had no live lease for this token (ended, or never issued); the reservation this open made is released")
	}
	if err != nil {
		return 0, h.fsys.refuse("write", h.resource, c, toErrno(err), err)
	}
	return uint32(len(data)), 0
}

// lockedLease returns the lease that this open file holds by a lock
// (flock, or an fcntl lock taken through it) and reports whether it holds
// one; the lease may have ended since (ended by another: an rm, a lost
// etcd session), which l.Live() tells. err is the store's failure.
func (h *leaseHandle) lockedLease(ctx context.Context) (l leasecore.Lease, holds bool, err error) {
	h.mu.Lock()
	id, holds := h.id, h.bound
	keys := h.posixKeys
	h.mu.Unlock()
	for _, key := range keys {
		if held, ok := h.fsys.posix.get(key); ok && held == id {
			holds = true
		}
	}
	if !holds {
		return leasecore.Lease{}, false, nil
	}
	l, err = h.fsys.store.Load(ctx, id)
	if errors.Is(err, leasecore.ErrNotFound) {
		return leasecore.Lease{ID: id, Resource: h.resource, Status: leasecore.StatusAbandoned}, true, nil
	}
	return l, true, err
}

// lateNote reports whether data, which is not meant as a payload, is a
// note that arrives through this open file after its own unlock ended the
// lease it held, and nothing has held the name through it since: Python's
// buffered writes reach the daemon at the close, and lock libraries
// (portalocker) unlock before they close. Such a write is accepted and
// changes nothing (docs/PROTOCOL.md §4.2, "Notes").
func (h *leaseHandle) lateNote(ctx context.Context, data []byte) bool {
	h.mu.Lock()
	unlocked, id := h.unlocked, h.id
	h.mu.Unlock()
	if unlocked == "" || unlocked != id {
		return false
	}
	if l, err := h.fsys.store.Load(ctx, id); err == nil && l.Live() {
		return false // still live: not ended by the unlock after all
	}
	_, err := noteText(data)
	return err == nil
}

// noteText returns data as a holder's note: white space around it
// dropped, at most [leasecore.MaxNote] bytes of UTF-8 without NUL, not
// empty (docs/PROTOCOL.md §4.2, "Notes"). Errors: ErrInvalidArgument.
func noteText(data []byte) (string, error) {
	text := strings.TrimSpace(string(data))
	if text == "" {
		return "", fmt.Errorf("%w: an empty note", leasecore.ErrInvalidArgument)
	}
	return text, leasecore.CheckNote(text)
}

// note records text that is not a payload, written through the open file
// that holds handle lease l, as the holder's note (docs/PROTOCOL.md §4.2,
// "Notes"): lock libraries write their pid or a line into the lock file
// they locked. Surrounding white space is dropped. Errors: EINVAL over
// [leasecore.MaxNote] bytes or not UTF-8 text; EACCES for a caller that is
// not the holder uid or root; ESTALE once l has ended; ENOSPC, EIO.
func (h *leaseHandle) note(ctx context.Context, c caller, l leasecore.Lease, data []byte) (uint32, syscall.Errno) {
	text, err := noteText(data)
	if err != nil {
		return 0, h.fsys.refuse("write", h.resource, c, syscall.EINVAL, "neither a payload nor a note: "+err.Error())
	}
	if !c.mayHold(l) {
		return 0, h.fsys.refuse("write", h.resource, c, syscall.EACCES, "not the holder uid")
	}
	if _, err := h.fsys.store.Note(ctx, l.ID, text); err != nil {
		return 0, h.fsys.refuse("write", h.resource, c, toErrno(err), err)
	}
	return uint32(len(data)), 0
}

// Flush ends the fcntl handle lease that the flushing lock owner holds on
// this name, whichever descriptor of the name it closed (POSIX.1 fcntl:
// closing any descriptor of a file releases the process's locks on it).
// FLUSH comes for every close() of every descriptor; it ends no other lease,
// flock handle leases included (docs/ARCHITECTURE.md, kernel facts,
// docs/PROTOCOL.md §6).
func (h *leaseHandle) Flush(ctx context.Context) syscall.Errno {
	if owner, ok := h.fsys.flushes.owner(ctx); ok {
		h.fsys.posixClose(posixKey{resource: h.resource, owner: owner})
	}
	return 0
}

// Fsync does nothing: every change is durable before its write returns.
func (h *leaseHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno { return 0 }

// Release ends the handle lease bound to this open file by flock, or by an
// fcntl lock taken through it that its owner has not released yet, as
// complete: RELEASE comes once, when the last descriptor of the open file
// is closed, including by the kernel when the holder dies (docs/PROTOCOL.md §6).
// A lock wait of this open file that an interrupt parked is abandoned.
// Token leases are not touched.
func (h *leaseHandle) Release(ctx context.Context) syscall.Errno {
	for _, w := range h.fsys.parked.released(h) {
		h.fsys.abandonWait(w)
	}
	h.mu.Lock()
	id, bound, keys := h.id, h.bound, h.posixKeys
	h.bound, h.posixKeys = false, nil
	h.mu.Unlock()
	h.node.mu.Lock()
	delete(h.node.handles, h)
	h.node.mu.Unlock()
	if bound {
		h.fsys.endHandleLease(id, "open file released")
	}
	for _, key := range keys {
		h.fsys.posixCloseIf(key, id)
	}
	return 0
}
