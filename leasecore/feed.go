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
	// ChangeNoted: [Store.Note] recorded the holder's note (EventChanged).
	ChangeNoted
)

// Event is one change of the store, carrying a copy of the lease after it.
type Event struct {
	Kind   EventKind
	Change Change
	Lease  Lease
}

// Feed fans a store's events out to its [Store.Watch] subscribers, each
// with an unbounded queue, so that publishing never blocks and no
// subscriber misses an event. Events may carry the revision of the change
// (a store with a shared, ordered log of changes, as etcd's): a subscriber
// that started at revision from receives only the events after it. The
// zero value is an open feed with no subscribers. Safe for concurrent use.
// Lock order: Feed.mu, then a subscriber's mu.
type Feed struct {
	mu     sync.Mutex
	subs   map[*subscriber]struct{}
	closed bool
}

// subscriber is one [Store.Watch] channel and the events not yet sent on
// it.
type subscriber struct {
	// from is the revision the subscriber started at: events of changes
	// at or before it happened before it subscribed.
	from int64
	// kinds is the set of event kinds it receives (bit 1<<kind) unless
	// all is set.
	kinds   uint32
	all     bool
	mu      sync.Mutex
	pending []Event
	wake    chan struct{} // buffered 1: pending grew
	done    chan struct{} // closed when the feed closes
}

// Subscribe returns a channel that receives, in order, every event
// published from now on whose revision is after from (events published
// with revision 0 always count; a store without revisions passes 0) and
// whose kind is one of kinds (every kind when none is given), until ctx is
// done or the feed is closed; then it is closed. After Close it returns a
// closed channel. An event of another kind costs the subscriber nothing:
// Publish does not wake it.
func (f *Feed) Subscribe(ctx context.Context, from int64, kinds ...EventKind) <-chan Event {
	out := make(chan Event)
	sub := &subscriber{from: from, kinds: kindSet(kinds), all: len(kinds) == 0, wake: make(chan struct{}, 1), done: make(chan struct{})}
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

// kindSet returns the set of kinds as a bit mask (1<<kind each); a kind
// outside 0–31 (no such kind exists) adds nothing.
func kindSet(kinds []EventKind) uint32 {
	var set uint32
	for _, k := range kinds {
		if k >= 0 && k < 32 {
			set |= 1 << uint(k)
		}
	}
	return set
}

// wants reports whether sub receives events of kind k.
func (sub *subscriber) wants(k EventKind) bool {
	return sub.all || k >= 0 && k < 32 && sub.kinds&(1<<uint(k)) != 0
}

func (f *Feed) unsubscribe(sub *subscriber) {
	f.mu.Lock()
	delete(f.subs, sub)
	f.mu.Unlock()
}

// Publish queues e, the change made at revision rev (0: no revision, or a
// change seen only by this store), for every subscriber that started
// before it; it never blocks. After Close it drops e.
func (f *Feed) Publish(rev int64, e Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	for sub := range f.subs {
		if rev != 0 && rev <= sub.from || !sub.wants(e.Kind) {
			continue
		}
		sub.mu.Lock()
		sub.pending = append(sub.pending, e)
		sub.mu.Unlock()
		select {
		case sub.wake <- struct{}{}:
		default:
		}
	}
}

// Close ends every subscription once its pending events are delivered; a
// second call is a no-op.
func (f *Feed) Close() {
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
