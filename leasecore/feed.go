package leasecore

import (
	"context"
	"sync"
)

// EventKind says what happened to a lease.
type EventKind int

// Event kinds of the change feed ([Store.Watch]).
const (
	// EventReserved: a lease was granted.
	EventReserved EventKind = iota + 1
	// EventChanged: a live lease was renewed, annotated, bound to an open
	// file or asked to give way (takeover request).
	EventChanged
	// EventEnded: a lease ended, by its holder or by a liveness rule
	// ([Event.Change] says which); its name may be free.
	EventEnded
)

// String names the kind: "reserved", "changed" or "ended".
func (k EventKind) String() string {
	switch k {
	case EventReserved:
		return "reserved"
	case EventChanged:
		return "changed"
	case EventEnded:
		return "ended"
	}
	return "unknown"
}

// Change says which change of a lease an [Event] reports, more finely than
// its [EventKind]: which method changed a live lease, and who ended one.
type Change int

// Changes of the change feed; each belongs to one [EventKind].
const (
	// ChangeReserved: [Store.Reserve] or [Store.Acquire] granted the
	// lease (EventReserved).
	ChangeReserved Change = iota + 1
	// ChangeRenewed: [Store.Renew] moved its heartbeat, applying any
	// annotations (EventChanged).
	ChangeRenewed
	// ChangeBound: [Store.Bind] made it a handle lease or recorded its new
	// holder pid (EventChanged).
	ChangeBound
	// ChangeTakeoverRequested: [Store.RequestTakeover] recorded a request
	// (EventChanged).
	ChangeTakeoverRequested
	// ChangeReleased: [Store.Release] or [Store.End] ended it, called by
	// its holder or on the holder's behalf: an unlink, a lock released,
	// its open file closed, a handover (EventEnded).
	ChangeReleased
	// ChangeExpired: the store ended it itself, because a liveness rule of
	// docs/PROTOCOL.md §5 killed it or, when the store opened, because its
	// record could not stand: a handle lease of a previous daemon (§2), or
	// an active record superseded by a newer one (EventEnded).
	ChangeExpired
)

// Event is one change of the store, carrying a copy of the lease after it.
type Event struct {
	Kind   EventKind
	Change Change
	Lease  Lease
}

// feed fans events out to subscribers, each with an unbounded queue, so
// that publishing never blocks and no subscriber misses an event. Safe for
// concurrent use. Lock order: feed.mu, then a subscriber's mu.
type feed struct {
	mu     sync.Mutex
	subs   map[*subscriber]struct{}
	closed bool
}

// subscriber is one [Store.Watch] channel and the events not yet sent on
// it.
type subscriber struct {
	mu      sync.Mutex
	pending []Event
	wake    chan struct{} // buffered 1: pending grew
	done    chan struct{} // closed when the feed closes
}

// subscribe returns a channel that receives every event published from now
// on, in order, until ctx is done or the feed is closed; then it is closed.
func (f *feed) subscribe(ctx context.Context) <-chan Event {
	out := make(chan Event)
	sub := &subscriber{wake: make(chan struct{}, 1), done: make(chan struct{})}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		close(out)
		return out
	}
	if f.subs == nil {
		f.subs = make(map[*subscriber]struct{})
	}
	f.subs[sub] = struct{}{}
	f.mu.Unlock()
	go func() {
		defer close(out)
		defer f.unsubscribe(sub)
		for {
			sub.mu.Lock()
			batch := sub.pending
			sub.pending = nil
			sub.mu.Unlock()
			for _, e := range batch {
				select {
				case out <- e:
				case <-ctx.Done():
					return
				}
			}
			if len(batch) > 0 {
				continue
			}
			select {
			case <-sub.wake:
			case <-sub.done:
				sub.mu.Lock()
				left := len(sub.pending)
				sub.mu.Unlock()
				if left == 0 {
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

func (f *feed) unsubscribe(sub *subscriber) {
	f.mu.Lock()
	delete(f.subs, sub)
	f.mu.Unlock()
}

// publish queues e for every subscriber; it never blocks.
func (f *feed) publish(e Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for sub := range f.subs {
		sub.mu.Lock()
		sub.pending = append(sub.pending, e)
		sub.mu.Unlock()
		select {
		case sub.wake <- struct{}{}:
		default:
		}
	}
}

// close ends every subscription once its pending events are delivered.
func (f *feed) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.closed = true
	for sub := range f.subs {
		close(sub.done)
	}
}
