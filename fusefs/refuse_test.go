package fusefs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/leasefs/leasefs/internal/engine"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/leasefs/leasefs/internal/refusal"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// logLines is a log written as JSON lines. Safe for concurrent use.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// lines returns every line logged so far, decoded.
func (l *logLines) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(l.buf.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// summary renders each line of the log as "LEVEL msg op errno[ suppressed=N]".
func (l *logLines) summary(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, m := range l.lines(t) {
		s := m["level"].(string) + " " + m["msg"].(string) + " " + m["op"].(string) + " " + m["errno"].(string)
		if n, ok := m["suppressed"]; ok {
			s += fmt.Sprint(" suppressed=", n)
		}
		out = append(out, s)
	}
	return out
}

// Each kind of refusal is logged at its level: conflicts at DEBUG as
// "conflict", failures and misuse at WARN as "refused"; every refusal
// reaches OnRefuse, logged or not.
func TestRefusalLevels(t *testing.T) {
	var log logLines
	var calls hookCalls
	r := newRefusalLog(slog.New(slog.NewJSONHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug})), calls.refuse)
	c := caller{uid: uidAlice}
	for _, e := range []syscall.Errno{syscall.EAGAIN, syscall.EEXIST, syscall.EINTR, syscall.EACCES, syscall.EPERM, syscall.EINVAL, syscall.EDQUOT, syscall.EIO, syscall.ENOSPC} {
		if got := r.refuse("op", "res", c, e, "why"); got != e {
			t.Errorf("refuse(%v) returned %v", e, got)
		}
	}
	want := []string{
		"DEBUG conflict op EAGAIN", "DEBUG conflict op EEXIST", "DEBUG conflict op EINTR",
		"WARN refused op EACCES", "WARN refused op EPERM", "WARN refused op EINVAL", "WARN refused op EDQUOT",
		"WARN refused op EIO", "WARN refused op ENOSPC",
	}
	if got := log.summary(t); !slices.Equal(got, want) {
		t.Errorf("log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got, _ := calls.get(); len(got) != len(want) {
		t.Errorf("OnRefuse saw %d refusals, want %d: %q", len(got), len(want), got)
	}
	// At the daemon's default level, INFO, a conflict writes nothing.
	var quiet logLines
	q := newRefusalLog(slog.New(slog.NewJSONHandler(&quiet, nil)), nil)
	q.refuse("flock", "res", c, syscall.EWOULDBLOCK, "held")
	if got := quiet.summary(t); len(got) != 0 {
		t.Errorf("a conflict at level INFO logged %q", got)
	}
}

// Misuse is limited per caller uid: a burst, then the refill rate; the
// next line logged says how many were left out; another uid and the
// store's failures are not held back by it.
func TestRefusalRateLimit(t *testing.T) {
	clock := clocktest.NewFakeClock(time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC))
	var log logLines
	var calls hookCalls
	r := newRefusalLog(slog.New(slog.NewJSONHandler(&log, nil)), calls.refuse)
	r.limit = refusal.NewLimiter(refusal.Options{PerSecond: 1, Burst: 3, Now: clock.Now})
	alice, bob := caller{uid: uidAlice}, caller{uid: uidBob}
	for range 10 {
		r.refuse("write", "res", alice, syscall.EACCES, "wrong token")
	}
	r.refuse("unlink", "res", bob, syscall.EPERM, "not the holder uid")
	r.refuse("write", "res", alice, syscall.EIO, "the disk failed")
	clock.Advance(2 * time.Second)
	for range 3 {
		r.refuse("write", "res", alice, syscall.EACCES, "wrong token")
	}
	want := []string{
		"WARN refused write EACCES", "WARN refused write EACCES", "WARN refused write EACCES",
		"WARN refused unlink EPERM",
		"WARN refused write EIO",
		"WARN refused write EACCES suppressed=7", "WARN refused write EACCES",
	}
	if got := log.summary(t); !slices.Equal(got, want) {
		t.Errorf("log:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got, _ := calls.get(); len(got) != 15 {
		t.Errorf("OnRefuse saw %d refusals, want all 15", len(got))
	}
}

// Through the node tree: a flock -n on a held name and an O_EXCL create of
// it log no warning; another uid opening the lease for writing does.
func TestConflictsAreNotWarnings(t *testing.T) {
	clock := clocktest.NewFakeClock(time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC))
	store := engine.NewMemStore(leasecore.Options{Clock: clock, Host: "testhost", Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { _ = store.Close() })
	var log logLines
	f := New(store, Options{Logger: slog.New(slog.NewJSONHandler(&log, nil))})
	_ = f.RawFileSystem()
	n, holder := mustCreate(t, as(uidAlice), f.root, "q")
	if errno := holder.Setlk(as(uidAlice), 1, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK); errno != 0 {
		t.Fatalf("holder flock: %v", errno)
	}
	waiter := openAs(t, n, uidBob, syscall.O_RDONLY)
	for range 5 {
		if errno := waiter.Setlk(as(uidBob), 2, flockLk(syscall.F_WRLCK), fuse.FUSE_LK_FLOCK); errno != syscall.EWOULDBLOCK {
			t.Fatalf("flock -n on a held name = %v, want EWOULDBLOCK", errno)
		}
	}
	if _, _, _, errno := create(t, as(uidBob), f.root, "q", syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDONLY); errno != syscall.EEXIST {
		t.Fatalf("O_EXCL create of a held name = %v, want EEXIST", errno)
	}
	if _, _, errno := n.Open(as(uidBob), syscall.O_WRONLY); errno != syscall.EACCES {
		t.Fatalf("another uid's open for writing = %v, want EACCES", errno)
	}
	var warnings []string
	for _, m := range log.lines(t) {
		if m["level"] == "WARN" {
			warnings = append(warnings, m["msg"].(string)+" "+m["op"].(string)+" "+m["errno"].(string))
		}
	}
	if want := []string{"refused open EACCES"}; !slices.Equal(warnings, want) {
		t.Errorf("warnings %q, want %q", warnings, want)
	}
}
