package leasecore

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A subscriber gets, in order, every event published after it subscribed
// whose revision is after its start; revision 0 always counts; Close
// delivers what is pending and then closes the channel.
func TestFeedRevisionsAndClose(t *testing.T) {
	var f Feed
	ctx := context.Background()
	early := f.Subscribe(ctx, 0)
	late := f.Subscribe(ctx, 10)
	ev := func(id string) Event { return Event{Kind: EventChanged, Lease: Lease{ID: id}} }
	f.Publish(5, ev("r5"))
	f.Publish(0, ev("local"))
	f.Publish(11, ev("r11"))
	f.Close()
	f.Publish(12, ev("after close"))
	read := func(ch <-chan Event) []string { return drainFeed(t, ch) }
	if got := read(early); len(got) != 3 || got[0] != "r5" || got[1] != "local" || got[2] != "r11" {
		t.Errorf("subscriber from 0 got %q, want r5 local r11", got)
	}
	if got := read(late); len(got) != 2 || got[0] != "local" || got[1] != "r11" {
		t.Errorf("subscriber from 10 got %q, want local r11", got)
	}
	if _, ok := <-f.Subscribe(ctx, 0); ok {
		t.Error("Subscribe after Close: the channel is open")
	}
}

// A subscriber that names kinds gets only events of those kinds, in
// order; one that names a kind that does not exist gets nothing, not
// everything.
func TestFeedKinds(t *testing.T) {
	var f Feed
	ctx := context.Background()
	ends := f.Subscribe(ctx, 0, EventEnded)
	two := f.Subscribe(ctx, 0, EventReserved, EventEnded)
	none := f.Subscribe(ctx, 0, EventKind(99))
	for i, k := range []EventKind{EventReserved, EventChanged, EventEnded, EventChanged, EventEnded} {
		f.Publish(0, Event{Kind: k, Lease: Lease{ID: string(rune('a' + i))}})
	}
	f.Close()
	read := func(ch <-chan Event) string { return strings.Join(drainFeed(t, ch), "") }
	if got := read(ends); got != "ce" {
		t.Errorf("watch of the ends got %q, want ce", got)
	}
	if got := read(two); got != "ace" {
		t.Errorf("watch of reservations and ends got %q, want ace", got)
	}
	if got := read(none); got != "" {
		t.Errorf("watch of a kind that does not exist got %q, want nothing", got)
	}
}

// drainFeed returns the lease ids of the events on ch until it is closed,
// failing the test if it is not closed within 10 s.
func drainFeed(t *testing.T, ch <-chan Event) []string {
	t.Helper()
	var ids []string
	timeout := time.After(10 * time.Second)
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				return ids
			}
			ids = append(ids, e.Lease.ID)
		case <-timeout:
			t.Fatalf("the feed did not close; got %q", ids)
		}
	}
}
