package engine

import (
	"slices"

	"github.com/leasefs/leasefs/leasecore"
)

// waitQueues are the blocked [leasecore.Store.Acquire] calls of each resource, first
// come first served (docs/PROTOCOL.md §6). They are guarded by the store's
// mutex: not safe for concurrent use on their own.
type waitQueues map[string][]*waiter

// waiter is one blocked Acquire. When the name is freed, the store
// reserves it for the head waiter at once, under the same hold of its
// mutex (baton passing), so that no other caller can take the name in
// between: it sets done with the outcome and signals turn (buffered 1).
// turn is also signalled when the waiter should look again (the store is
// closing). Fields are guarded by the store's mutex.
type waiter struct {
	turn  chan struct{}
	draft leasecore.Draft
	done  bool
	grant leasecore.Grant
	err   error
}

// enqueue appends a new waiter for draft d to resource's queue.
func (q waitQueues) enqueue(resource string, d leasecore.Draft) *waiter {
	w := &waiter{turn: make(chan struct{}, 1), draft: d}
	q[resource] = append(q[resource], w)
	return w
}

// pushFront puts w first in resource's queue.
func (q waitQueues) pushFront(resource string, w *waiter) {
	q[resource] = append([]*waiter{w}, q[resource]...)
}

// head returns the first waiter of resource, nil if none.
func (q waitQueues) head(resource string) *waiter {
	if ws := q[resource]; len(ws) > 0 {
		return ws[0]
	}
	return nil
}

// remove takes w out of resource's queue.
func (q waitQueues) remove(resource string, w *waiter) {
	rest := slices.DeleteFunc(q[resource], func(x *waiter) bool { return x == w })
	if len(rest) == 0 {
		delete(q, resource)
		return
	}
	q[resource] = rest
}

// signal wakes w.
func (w *waiter) signal() {
	select {
	case w.turn <- struct{}{}:
	default:
	}
}

// count returns the number of waiters on resource.
func (q waitQueues) count(resource string) int { return len(q[resource]) }

// counts returns the number of waiters of every resource that has some.
func (q waitQueues) counts() map[string]int {
	out := make(map[string]int, len(q))
	for r, ws := range q {
		out[r] = len(ws)
	}
	return out
}

// wakeAll signals every waiter (the store is closing).
func (q waitQueues) wakeAll() {
	for _, ws := range q {
		for _, w := range ws {
			select {
			case w.turn <- struct{}{}:
			default:
			}
		}
	}
}
