package leasecore

import "slices"

// waitQueues are the blocked [Store.Acquire] calls of each resource, first
// come first served (docs/PROTOCOL.md §6). They are guarded by the store's
// mutex: not safe for concurrent use on their own.
type waitQueues map[string][]*waiter

// waiter is one blocked Acquire. turn is signalled (buffered 1) when the
// waiter should look at the name again: it became the head, or the lease
// it waits on ended.
type waiter struct{ turn chan struct{} }

// enqueue appends a new waiter to resource's queue.
func (q waitQueues) enqueue(resource string) *waiter {
	w := &waiter{turn: make(chan struct{}, 1)}
	q[resource] = append(q[resource], w)
	return w
}

// remove takes w out of resource's queue and signals the new head.
func (q waitQueues) remove(resource string, w *waiter) {
	rest := slices.DeleteFunc(q[resource], func(x *waiter) bool { return x == w })
	if len(rest) == 0 {
		delete(q, resource)
		return
	}
	q[resource] = rest
	q.wakeHead(resource)
}

// isHead reports whether w is first in resource's queue.
func (q waitQueues) isHead(resource string, w *waiter) bool {
	ws := q[resource]
	return len(ws) > 0 && ws[0] == w
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

// wakeHead signals the first waiter of resource, if any.
func (q waitQueues) wakeHead(resource string) {
	if ws := q[resource]; len(ws) > 0 {
		select {
		case ws[0].turn <- struct{}{}:
		default:
		}
	}
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
