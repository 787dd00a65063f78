package fusefs

import "sync"

// lookupSlots is the number of slots of [threadLookups]: threads whose ids
// are equal modulo it share one.
const lookupSlots = 1024

// threadLookups remembers, per calling thread, the lease that the thread's
// last LOOKUP found, so that an UNLINK, which names only the directory and
// the name, ends the lease its own system call looked up. unlink(2) looks
// the name up (a LOOKUP from the same thread, since entries never stay
// valid: docs/ARCHITECTURE.md, kernel facts) and then sends UNLINK; in
// between, the lease may end and the name be granted to another caller,
// and another process's LOOKUP may put the new lease's node in the inode
// tree. The slots are a fixed array indexed by thread id, so the table
// never grows; a thread whose slot another thread has overwritten since
// its lookup has no record, and its unlink falls back on the inode tree.
// Safe for concurrent use; its locks are leaves.
type threadLookups struct {
	slots [lookupSlots]lookupSlot
}

// lookupSlot is one thread's last lookup of a lease.
type lookupSlot struct {
	mu       sync.Mutex
	tid      int
	resource string
	id       string
}

// found records that thread tid's lookup of resource found lease id.
func (t *threadLookups) found(tid int, resource, id string) {
	if tid <= 0 {
		return
	}
	s := &t.slots[tid%lookupSlots]
	s.mu.Lock()
	s.tid, s.resource, s.id = tid, resource, id
	s.mu.Unlock()
}

// take returns and forgets the lease that thread tid's last lookup found,
// if that lookup was of resource.
func (t *threadLookups) take(tid int, resource string) (id string, ok bool) {
	if tid <= 0 {
		return "", false
	}
	s := &t.slots[tid%lookupSlots]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tid != tid || s.resource != resource {
		return "", false
	}
	id = s.id
	s.tid, s.resource, s.id = 0, "", ""
	return id, true
}
