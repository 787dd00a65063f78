package fusefs

import "testing"

// A thread's record is its last lookup, taken once, and only for the
// resource it looked up; a thread sharing the slot overwrites it.
func TestThreadLookups(t *testing.T) {
	var l threadLookups
	l.found(7, "a", "lease-1")
	l.found(7, "b", "lease-2")
	if _, ok := l.take(7, "a"); ok {
		t.Error("take(7, a) found a record after the thread looked up b")
	}
	if id, ok := l.take(7, "b"); !ok || id != "lease-2" {
		t.Errorf("take(7, b) = %q, %v; want lease-2", id, ok)
	}
	if _, ok := l.take(7, "b"); ok {
		t.Error("a record was taken twice")
	}
	l.found(7, "c", "lease-3")
	l.found(7+lookupSlots, "c", "lease-4") // the same slot
	if _, ok := l.take(7, "c"); ok {
		t.Error("take(7, c) found a record that another thread's lookup overwrote")
	}
	if id, ok := l.take(7+lookupSlots, "c"); !ok || id != "lease-4" {
		t.Errorf("take of the overwriting thread = %q, %v; want lease-4", id, ok)
	}
	l.found(0, "d", "lease-5") // no thread known: nothing recorded
	if _, ok := l.take(0, "d"); ok {
		t.Error("a lookup without a thread id was recorded")
	}
}
