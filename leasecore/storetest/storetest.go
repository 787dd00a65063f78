// Package storetest is the contract suite of [leasecore.Store]: every
// outcome of the interface, checked against any implementation. A store
// package runs it from a test:
//
//	func TestContract(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, opts leasecore.Options) leasecore.Store {
//			s := engine.NewMemStore(opts)
//			t.Cleanup(func() { s.Close() })
//			return s
//		})
//	}
//
// Time is a [clocktest.FakeClock] advanced by the tests; the only real
// waits are bounded guards against a hang (a store's reaper runs on its own
// goroutine), never timing assertions.
package storetest

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/leasefs/leasefs/leasecore"

	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// Factory opens a fresh, empty store with opts (Clock, Host, LeaseDuration,
// ReapInterval and MaxLeasesPerUID are set by the suite) and arranges for it
// to be closed when t ends.
type Factory func(t *testing.T, opts leasecore.Options) leasecore.Store

// start is the fake wall time every store of the suite begins at.
var start = time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)

// guard bounds every wait for something a store does on its own goroutine.
const guard = 10 * time.Second

// leaseDuration is the TTL of the suite's stores.
const leaseDuration = time.Minute

// env is one store under test and its clock.
type env struct {
	t     *testing.T
	s     leasecore.Store
	clock *clocktest.FakeClock
}

func newEnv(t *testing.T, open Factory, maxPerUID int) *env {
	t.Helper()
	clock := clocktest.NewFakeClock(start)
	s := open(t, leasecore.Options{
		Clock: clock, Host: "contract-host", LeaseDuration: leaseDuration,
		ReapInterval: 5 * time.Millisecond, MaxLeasesPerUID: maxPerUID,
		Logger: slog.New(slog.DiscardHandler),
	})
	return &env{t: t, s: s, clock: clock}
}

func (e *env) reserve(resource string, uid uint32) leasecore.Grant {
	e.t.Helper()
	g, err := e.s.Reserve(context.Background(), leasecore.Draft{Resource: resource, HolderUID: uid, HolderGID: uid, HolderPID: 42})
	if err != nil {
		e.t.Fatalf("Reserve(%q): %v", resource, err)
	}
	return g
}

// awaitEnd waits on feed for the end of lease id.
func (e *env) awaitEnd(feed <-chan leasecore.Event, id string) leasecore.Lease {
	e.t.Helper()
	timeout := time.After(guard)
	for {
		select {
		case ev, ok := <-feed:
			if !ok {
				e.t.Fatalf("feed closed before lease %s ended", id)
			}
			if ev.Kind == leasecore.EventEnded && ev.Lease.ID == id {
				return ev.Lease
			}
		case <-timeout:
			e.t.Fatalf("no end of lease %s on the feed within %v", id, guard)
		}
	}
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: error %v, want %v", what, err, want)
	}
}

// Run runs the contract suite against the stores open makes.
func Run(t *testing.T, open Factory) {
	tests := []struct {
		name string
		run  func(t *testing.T, open Factory)
	}{
		{"ReserveConflictNamesHolder", testReserveConflict},
		{"TokenMismatch", testTokenMismatch},
		{"Inactive", testInactive},
		{"ExpiryOnFakeClock", testExpiry},
		{"ReadsArePure", testReadsArePure},
		{"GenerationsIncrease", testGenerations},
		{"EventsForEveryEnd", testEvents},
		{"ReleaseAppliesAnnotations", testReleaseAnnotations},
		{"BindMakesHandleLease", testBind},
		{"NoteOfTheHolder", testNote},
		{"Quota", testQuota},
		{"Namespaces", testNamespaces},
		{"AcquireFirstComeFirstServed", testAcquireFIFO},
		{"AcquireCancelled", testAcquireCancel},
		{"AcquireWokenByExpiry", testAcquireExpiry},
		{"Close", testClose},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.run(t, open)
		})
	}
}
