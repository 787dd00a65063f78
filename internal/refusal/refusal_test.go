package refusal

import (
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// Conflicts are the errnos of contention, failures those of the store;
// the rest is misuse.
func TestClassify(t *testing.T) {
	want := map[Kind][]syscall.Errno{
		Conflict: {syscall.EAGAIN, syscall.EWOULDBLOCK, syscall.EEXIST, syscall.EINTR},
		Failure:  {syscall.EIO, syscall.ENOSPC, syscall.EROFS, syscall.ENOTCONN},
		Misuse:   {syscall.EACCES, syscall.EPERM, syscall.EINVAL, syscall.EDQUOT, syscall.ESTALE, syscall.ENOENT, syscall.ENOLCK, syscall.EFBIG, syscall.ENAMETOOLONG, 0},
	}
	for kind, errnos := range want {
		for _, e := range errnos {
			if got := Classify(e); got != kind {
				t.Errorf("Classify(%v) = %v, want %v", e, got, kind)
			}
		}
	}
}

// allowN calls l.Allow(key) n times and returns how many were allowed and
// the suppressed counts they reported.
func allowN(l *Limiter, key uint32, n int) (allowed int, suppressed []int) {
	for range n {
		if ok, s := l.Allow(key); ok {
			allowed++
			suppressed = append(suppressed, s)
		}
	}
	return allowed, suppressed
}

// A caller gets Burst lines at once, then PerSecond a second; the first
// line after a pause reports how many were left out; callers are apart.
func TestLimiterPerCaller(t *testing.T) {
	clock := clocktest.NewFakeClock(time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC))
	l := NewLimiter(Options{PerSecond: 2, Burst: 5, Now: clock.Now})
	if n, _ := allowN(l, 1000, 20); n != 5 {
		t.Fatalf("20 lines at once: %d allowed, want the burst of 5", n)
	}
	if ok, _ := l.Allow(2000); !ok {
		t.Fatalf("another caller is limited by the first one's lines")
	}
	clock.Advance(1500 * time.Millisecond) // 3 tokens back
	n, s := allowN(l, 1000, 10)
	if n != 3 || s[0] != 15 || s[1] != 0 || s[2] != 0 {
		t.Fatalf("after 1.5 s: %d allowed reporting %v suppressed, want 3, the first reporting 15", n, s)
	}
	clock.Advance(time.Hour) // refills to the burst, no more
	n, s = allowN(l, 1000, 10)
	if n != 5 || s[0] != 7 {
		t.Fatalf("after an hour: %d allowed reporting %v, want 5, the first reporting 7", n, s)
	}
	clock.StepWall(-time.Minute) // the wall clock stepping back refills nothing
	if n, _ := allowN(l, 1000, 3); n != 0 {
		t.Fatalf("after the clock stepped back: %d allowed, want 0", n)
	}
}

// The limiter tracks at most MaxKeys callers: idle ones make room, and
// when none is idle new callers share the overflow bucket.
func TestLimiterBounded(t *testing.T) {
	clock := clocktest.NewFakeClock(time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC))
	l := NewLimiter(Options{PerSecond: 1, Burst: 2, MaxKeys: 3, Now: clock.Now})
	for key := uint32(1); key <= 3; key++ {
		allowN(l, key, 3) // each has one suppressed: none is idle
	}
	if n, _ := allowN(l, 4, 3); n != 2 {
		t.Fatalf("a fourth caller: %d allowed, want the overflow bucket's 2", n)
	}
	if n, _ := allowN(l, 5, 3); n != 0 {
		t.Fatalf("a fifth caller: %d allowed, want 0 (the overflow bucket is empty)", n)
	}
	if len(l.buckets) != 4 {
		t.Fatalf("%d buckets, want MaxKeys+1 = 4", len(l.buckets))
	}
	clock.Advance(time.Minute)
	for key := uint32(1); key <= 3; key++ {
		if ok, s := l.Allow(key); !ok || s != 1 {
			t.Fatalf("caller %d after a minute: %v reporting %d suppressed, want allowed reporting 1", key, ok, s)
		}
	}
	clock.Advance(time.Minute) // now all three are full with nothing suppressed: idle
	if n, s := allowN(l, 6, 3); n != 2 || s[0] != 0 {
		t.Fatalf("a new caller once others are idle: %d allowed (%v), want its own burst of 2", n, s)
	}
	if _, ok := l.buckets[6]; !ok {
		t.Fatalf("the new caller has no bucket of its own: %v", l.buckets)
	}
}
