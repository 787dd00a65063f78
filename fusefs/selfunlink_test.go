package fusefs

import (
	"testing"

	"github.com/leasefs/leasefs/leasecore"
)

// TestSelfUnlinkerQueue checks the worker's bounds: nothing is queued
// without a worker or after it stopped (the end then gets the
// notification), a full queue refuses, and a pending end is found by its
// resource only while its unlink runs.
func TestSelfUnlinkerQueue(t *testing.T) {
	var u selfUnlinker
	l := leasecore.Lease{ID: "l1", Resource: "ns/a"}
	if u.enqueue(l) {
		t.Fatal("enqueue without a worker succeeded")
	}
	if u.self(0) {
		t.Error("tid 0 counts as the worker")
	}
	u.queue = make(chan leasecore.Lease, 1)
	if !u.enqueue(l) {
		t.Fatal("enqueue into an empty queue failed")
	}
	if u.enqueue(l) {
		t.Error("enqueue into a full queue succeeded")
	}
	u.setPending(l, true)
	if got, ok := u.ended("ns/a"); !ok || got.ID != "l1" {
		t.Errorf("ended(ns/a) = %v, %v; want l1", got.ID, ok)
	}
	if _, ok := u.ended("ns/b"); ok {
		t.Error("ended(ns/b) found a lease")
	}
	u.setPending(l, false)
	if _, ok := u.ended("ns/a"); ok {
		t.Error("ended(ns/a) found a lease after its unlink")
	}
	u.stopped = true
	<-u.queue
	if u.enqueue(l) {
		t.Error("enqueue after stop succeeded")
	}
}

// TestStopSelfUnlinkWithoutStart checks that StopSelfUnlink is safe
// without a worker and twice.
func TestStopSelfUnlinkWithoutStart(t *testing.T) {
	var f FS
	f.StopSelfUnlink()
	f.StopSelfUnlink()
}
