package fusefs

import (
	"sync"

	"github.com/leasefs/leasefs/leasecore"
)

// unlinkedLeases holds the ids of leases being ended by an unlink through
// this mount, so that FS.Run leaves their ends to the kernel: the kernel
// drops the name from its dentry cache itself when an unlink succeeds (and
// raises the unlink's inotify events). A NotifyDelete per released lease
// cost 0.24 ms of /dev/fuse writes and took the directory's inode lock
// that the next create in the directory waits for.
//
// The unlink marks its lease before it ends it, since Run may see the end
// before the unlink returns. Run skips the notification of a marked lease's
// release tentatively, keeping the lease; if the unlink's end then fails,
// the release Run saw was another's (the holder's unlock or close won the
// race), the kernel keeps the name, and the unlink hands the lease back to
// Run to notify after all. The zero value is empty; wake must be made
// before use. Safe for concurrent use; mu is a leaf lock.
type unlinkedLeases struct {
	mu sync.Mutex
	// ids maps a marked lease id to what is known of its end.
	ids map[string]unlinkEnd
	// retry holds ended leases whose notification Run skipped for an
	// unlink that then failed; wake (buffered 1) tells Run.
	retry []leasecore.Lease
	wake  chan struct{}
}

// unlinkEnd is what is known of a marked lease's end: whether Run has seen
// a release of it (lease is that release), and whether the unlink's own
// end succeeded.
type unlinkEnd struct {
	seen, ended bool
	lease       leasecore.Lease
}

// mark marks lease id as being ended by an unlink.
func (u *unlinkedLeases) mark(id string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.ids == nil {
		u.ids = make(map[string]unlinkEnd)
	}
	u.ids[id] = unlinkEnd{}
}

// skip is called by Run for a released lease l: it reports whether l is
// marked. A mark whose unlink has ended the lease is done with; otherwise
// the release is remembered until the unlink reports its outcome.
func (u *unlinkedLeases) skip(l leasecore.Lease) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	e, ok := u.ids[l.ID]
	switch {
	case !ok:
		return false
	case e.ended:
		delete(u.ids, l.ID)
	default:
		u.ids[l.ID] = unlinkEnd{seen: true, lease: l}
	}
	return true
}

// forget is called by Run for any other end of lease id: the kernel does
// not show it, so Run notifies it whatever the unlink does.
func (u *unlinkedLeases) forget(id string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.ids, id)
}

// done reports the outcome of the unlink's end of lease id: ended says
// whether it succeeded. A success waits for Run to see the release, if it
// has not yet; a failure after Run skipped a release of the lease hands
// that release back to Run (retry, wake).
func (u *unlinkedLeases) done(id string, ended bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	e, ok := u.ids[id]
	switch {
	case !ok:
	case ended && !e.seen:
		u.ids[id] = unlinkEnd{ended: true}
	case !ended && e.seen:
		delete(u.ids, id)
		u.retry = append(u.retry, e.lease)
		select {
		case u.wake <- struct{}{}:
		default:
		}
	default:
		delete(u.ids, id)
	}
}

// takeRetries returns the leases handed back to Run, and empties the list.
func (u *unlinkedLeases) takeRetries() []leasecore.Lease {
	u.mu.Lock()
	defer u.mu.Unlock()
	r := u.retry
	u.retry = nil
	return r
}
