package leasecore

import (
	"sync"
	"time"
)

// Clock is the time source of a store. Now gives wall-clock time for records
// and people; Mono gives a monotonic reading (elapsed time since an arbitrary
// origin) that never jumps, used to measure heartbeat age while the store
// runs (docs/PROTOCOL.md §5). Implementations must be safe for concurrent use.
type Clock interface {
	// Now returns the current wall-clock time.
	Now() time.Time
	// Mono returns the monotonic time since the clock's origin.
	Mono() time.Duration
}

// SystemClock is the real [Clock]: time.Now for wall time, Go's monotonic
// clock reading for Mono. The zero value is not usable; call [NewSystemClock].
type SystemClock struct{ origin time.Time }

// NewSystemClock returns a [SystemClock] whose Mono origin is now.
func NewSystemClock() *SystemClock { return &SystemClock{origin: time.Now()} }

// Now returns time.Now(). Safe for concurrent use.
func (c *SystemClock) Now() time.Time { return time.Now() }

// Mono returns the monotonic time elapsed since [NewSystemClock]. Safe for
// concurrent use.
func (c *SystemClock) Mono() time.Duration { return time.Since(c.origin) }

// FakeClock is a manual [Clock] for tests: time moves only when
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
