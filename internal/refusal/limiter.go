package refusal

import (
	"math"
	"sync"
	"time"
)

// Defaults of [Options].
const (
	// DefaultPerSecond is the steady rate of log lines a caller may cause.
	DefaultPerSecond = 1.0
	// DefaultBurst is how many lines a caller may cause at once.
	DefaultBurst = 10
	// DefaultMaxKeys bounds the callers a [Limiter] tracks.
	DefaultMaxKeys = 1024
)

// OverflowKey is the key whose bucket callers share once a [Limiter]
// tracks Options.MaxKeys of them and none is idle: uid 4294967295, which
// is (uid_t)-1 and no process's uid.
const OverflowKey = math.MaxUint32

// Options configure [NewLimiter]. The zero value works.
type Options struct {
	// PerSecond is the rate at which a caller's bucket refills, in lines
	// per second; default [DefaultPerSecond].
	PerSecond float64
	// Burst is the size of a caller's bucket, in lines; default
	// [DefaultBurst].
	Burst int
	// MaxKeys bounds the number of buckets; default [DefaultMaxKeys].
	MaxKeys int
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Limiter is a token bucket per key (a caller uid): [Limiter.Allow] takes
// a token, Options.PerSecond tokens come back a second, and a bucket holds
// at most Options.Burst. A bucket that is full and has nothing suppressed
// is idle, and dropped when room is needed for a new key; when none is
// idle, new keys share the bucket of [OverflowKey], so that memory stays
// bounded whatever the callers do: at most MaxKeys+1 buckets. Safe for
// concurrent use.
type Limiter struct {
	perSecond float64
	burst     float64
	maxKeys   int
	now       func() time.Time

	mu      sync.Mutex // guards buckets
	buckets map[uint32]*bucket
}

// bucket is the state of one key.
type bucket struct {
	tokens     float64   // as of at
	at         time.Time // when tokens was last brought up to date
	suppressed int       // lines refused since the last allowed one
}

// NewLimiter returns a limiter with every bucket full.
func NewLimiter(o Options) *Limiter {
	if o.PerSecond <= 0 {
		o.PerSecond = DefaultPerSecond
	}
	if o.Burst <= 0 {
		o.Burst = DefaultBurst
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = DefaultMaxKeys
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Limiter{perSecond: o.PerSecond, burst: float64(o.Burst), maxKeys: o.MaxKeys, now: o.Now, buckets: make(map[uint32]*bucket)}
}

// Allow takes a token from key's bucket. ok reports whether there was one:
// log the line. suppressed is, when ok, the number of key's lines refused
// since its last allowed one (then reset to 0); 0 otherwise.
func (l *Limiter) Allow(key uint32) (ok bool, suppressed int) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucket(key, now)
	if elapsed := now.Sub(b.at).Seconds(); elapsed > 0 {
		b.tokens = math.Min(l.burst, b.tokens+elapsed*l.perSecond)
	}
	b.at = now // a clock that stepped back refills nothing
	if b.tokens < 1 {
		b.suppressed++
		return false, 0
	}
	b.tokens--
	suppressed, b.suppressed = b.suppressed, 0
	return true, suppressed
}

// bucket returns key's bucket, making room for it (see [Limiter]) when it
// is new. l.mu is held.
func (l *Limiter) bucket(key uint32, now time.Time) *bucket {
	if b, ok := l.buckets[key]; ok {
		return b
	}
	if len(l.buckets) >= l.maxKeys {
		full := time.Duration(l.burst / l.perSecond * float64(time.Second))
		for k, b := range l.buckets {
			if b.suppressed == 0 && k != OverflowKey && now.Sub(b.at) >= full {
				delete(l.buckets, k)
			}
		}
		if len(l.buckets) >= l.maxKeys {
			key = OverflowKey
			if b, ok := l.buckets[key]; ok {
				return b
			}
		}
	}
	b := &bucket{tokens: l.burst, at: now}
	l.buckets[key] = b
	return b
}
