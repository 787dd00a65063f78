// Package clocktest provides a manual clock for tests of lease logic: time
// moves only when the test says, so expiry is tested without sleeping. It
// implements leasecore.Clock without importing it, so leasecore's own tests
// can use it too.
package clocktest

import (
	"sync"
	"time"
)

// FakeClock is a manual leasecore.Clock for tests: time moves only when
// [FakeClock.Advance] or [FakeClock.StepWall] is called. Safe for concurrent
// use.
type FakeClock struct {
	mu   sync.Mutex
	wall time.Time
	mono time.Duration
}

// NewFakeClock returns a [FakeClock] whose wall time is start and whose
// monotonic reading starts at one hour (so that readings derived from
// records in the past stay positive).
func NewFakeClock(start time.Time) *FakeClock {
	return &FakeClock{wall: start, mono: time.Hour}
}

// Now returns the fake wall time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wall
}

// Mono returns the fake monotonic reading.
func (c *FakeClock) Mono() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mono
}

// Advance moves both the wall and the monotonic clock forward by d.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall = c.wall.Add(d)
	c.mono += d
}

// StepWall moves only the wall clock by d (which may be negative), as an
// administrator or NTP step would; the monotonic reading is unchanged.
func (c *FakeClock) StepWall(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall = c.wall.Add(d)
}
