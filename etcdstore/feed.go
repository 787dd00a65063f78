package etcdstore

import (
	"context"
	"sync"

	"github.com/leasefs/leasefs/leasecore"
)

// feed fans the store's events out to [Store.Watch] subscribers, each with
// an unbounded queue, so that publishing never blocks and no subscriber
// misses an event. Safe for concurrent use. Lock order: feed.mu, then a
// subscriber's mu.
type feed struct {
	mu     sync.Mutex
	subs   map[*subscriber]struct{}
	closed bool
}

type subscriber struct {
	// from is the revision the subscriber started at: events of changes
	// at or before it happened before Watch was called.
	from    int64
	mu      sync.Mutex
	pending []leasecore.Event
	wake    chan struct{} // buffered 1
	done    chan struct{} // closed with the feed
}

// subscribe returns a channel of every event published from now on whose
// revision is after from (local events have revision 0 and always
// count), until ctx is done or the feed closes.
func (f *feed) subscribe(ctx context.Context, from int64) <-chan leasecore.Event {
	out := make(chan leasecore.Event)
	sub := &subscriber{from: from, wake: make(chan struct{}, 1), done: make(chan struct{})}
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
		defer func() {
			f.mu.Lock()
			delete(f.subs, sub)
			f.mu.Unlock()
		}()
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

// publish queues e, the change made at revision rev (0: a change seen
// only by this store), for every subscriber that started before it.
func (f *feed) publish(rev int64, e leasecore.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for sub := range f.subs {
		if rev != 0 && rev <= sub.from {
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
