package leasecore

import "time"

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
