package fusefs

import "sync"

// unlinkedLeases holds the ids of leases being ended by an unlink through
// this mount, until FS.Run sees their end. The kernel drops the name from
// its dentry cache itself when an unlink succeeds (and raises the unlink's
// inotify events), so Run need not notify it: a NotifyDelete per released
// lease cost 0.24 ms of /dev/fuse writes and took the directory's inode
// lock that the next create of the same directory waits for. The zero
// value is empty. Safe for concurrent use.
type unlinkedLeases struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

// add marks lease id as being ended by an unlink.
func (u *unlinkedLeases) add(id string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.ids == nil {
		u.ids = make(map[string]struct{})
	}
	u.ids[id] = struct{}{}
}

// take reports whether lease id was marked, and unmarks it.
func (u *unlinkedLeases) take(id string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	_, ok := u.ids[id]
	delete(u.ids, id)
	return ok
}
