package metrics

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"github.com/leasefs/leasefs/filestore"
	"github.com/leasefs/leasefs/internal/engine"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/leaktest"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/leasecore/clocktest"
)

// TestMain fails the package when a goroutine of Registry.Follow outlives the tests.
func TestMain(m *testing.M) { leaktest.Main(m, "metrics.(*Registry).follow(") }

const leaseDuration = time.Minute

var quiet = slog.New(slog.DiscardHandler)

// testEnv is a registry following an in-memory store on a fake clock whose
// reaper never runs by itself: expiries happen when the test calls Reap.
type testEnv struct {
	reg   *Registry
	store *engine.MemStore
	clock *clocktest.FakeClock
}

func newEnv(t *testing.T) *testEnv {
	t.Helper()
	reg := New(Options{Logger: quiet})
	clock := clocktest.NewFakeClock(time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC))
	store := engine.NewMemStore(leasecore.Options{
		Clock: clock, Host: "testhost", LeaseDuration: leaseDuration, ReapInterval: time.Hour,
		Logger: quiet, OnCommit: reg.Committed,
	})
	t.Cleanup(func() { _ = store.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := reg.Follow(ctx, store); err != nil {
		t.Fatalf("Follow: %v", err)
	}
	return &testEnv{reg: reg, store: store, clock: clock}
}

func (e *testEnv) reserve(t *testing.T, resource string, mode leasecore.Mode) leasecore.Grant {
	t.Helper()
	g, err := e.store.Reserve(context.Background(), leasecore.Draft{Resource: resource, Mode: mode, HolderUID: 1000, HolderGID: 1000})
	if err != nil {
		t.Fatalf("Reserve(%q): %v", resource, err)
	}
	return g
}

// scrape serves one request to h and returns its samples by series, e.g.
// `leasefs_live_leases{mode="token"}`, and the body.
func scrape(t *testing.T, h http.Handler) (map[string]float64, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: status %d\n%s", rec.Code, rec.Body)
	}
	body := rec.Body.String()
	samples := make(map[string]float64)
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("malformed sample line %q", line)
		}
		samples[line[:i]] = v
	}
	return samples, body
}

// waitSamples scrapes h until every series in want has its value; the
// feed is followed on another goroutine, so counters catch up a moment
// after the store's change.
func waitSamples(t *testing.T, h http.Handler, want map[string]float64) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, body := scrape(t, h)
		var diff []string
		for series, v := range want {
			if g, ok := got[series]; !ok || g != v {
				diff = append(diff, fmt.Sprintf("%s = %v (present %v), want %v", series, g, ok, v))
			}
		}
		if len(diff) == 0 {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics not as expected after 10s:\n%s\n\nscrape:\n%s", strings.Join(diff, "\n"), body)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Reserves, renewals, releases (Release and End) and expiries each move
// their counter once; the gauges count live leases by mode; every durable
// change is one store commit.
func TestLeaseEvents(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	h := e.reg.Handler()
	waitSamples(t, h, map[string]float64{
		"leasefs_leases_reserved_total":                 0,
		"leasefs_lease_renewals_total":                  0,
		`leasefs_leases_ended_total{reason="released"}`: 0,
		`leasefs_leases_ended_total{reason="expired"}`:  0,
		`leasefs_live_leases{mode="token"}`:             0,
		`leasefs_live_leases{mode="handle"}`:            0,
		"leasefs_lock_waiters":                          0,
		"leasefs_store_commit_duration_seconds_count":   0,
		"leasefs_lock_wait_seconds_count":               0,
	})

	a := e.reserve(t, "a", leasecore.ModeToken)
	b := e.reserve(t, "b", leasecore.ModeToken)
	e.reserve(t, "c", leasecore.ModeToken)
	for range 2 {
		e.clock.Advance(time.Second)
		if _, err := e.store.Renew(ctx, a.Lease.ID, a.Token, nil); err != nil {
			t.Fatal(err)
		}
	}
	waitSamples(t, h, map[string]float64{
		"leasefs_leases_reserved_total":     3,
		"leasefs_lease_renewals_total":      2,
		`leasefs_live_leases{mode="token"}`: 3,
	})
	if _, err := e.store.Release(ctx, a.Lease.ID, a.Token, leasecore.StatusComplete, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.End(ctx, b.Lease.ID, leasecore.StatusAbandoned); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(leaseDuration) // c expires
	if ended, err := e.store.Reap(ctx); err != nil || len(ended) != 1 {
		t.Fatalf("Reap = %v, %v; want c ended", ended, err)
	}
	d := e.reserve(t, "d", leasecore.ModeHandle)
	if _, err := e.store.Bind(ctx, d.Lease.ID, 0); err != nil { // a change that is no renewal
		t.Fatal(err)
	}
	waitSamples(t, h, map[string]float64{
		"leasefs_leases_reserved_total":                 4,
		"leasefs_lease_renewals_total":                  2,
		`leasefs_leases_ended_total{reason="released"}`: 2,
		`leasefs_leases_ended_total{reason="expired"}`:  1,
		`leasefs_live_leases{mode="token"}`:             0,
		`leasefs_live_leases{mode="handle"}`:            1,
		// 4 reserves, 2 renewals, 3 ends; re-binding a handle lease
		// writes nothing.
		"leasefs_store_commit_duration_seconds_count": 9,
	})
}

// A blocked Acquire shows in leasefs_lock_waiters until it is granted;
// LockGranted observes one wait.
func TestLockWaiters(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	h := e.reg.Handler()
	held := e.reserve(t, "q", leasecore.ModeHandle)
	granted := make(chan error, 1)
	go func() {
		start := time.Now()
		_, err := e.store.Acquire(ctx, leasecore.Draft{Resource: "q", Mode: leasecore.ModeHandle, HolderUID: 1001})
		if err == nil {
			e.reg.LockGranted(time.Since(start))
		}
		granted <- err
	}()
	waitSamples(t, h, map[string]float64{"leasefs_lock_waiters": 1, `leasefs_live_leases{mode="handle"}`: 1})
	if _, err := e.store.End(ctx, held.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	if err := <-granted; err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	waitSamples(t, h, map[string]float64{
		"leasefs_lock_waiters":                          0,
		`leasefs_live_leases{mode="handle"}`:            1,
		"leasefs_leases_reserved_total":                 2,
		`leasefs_leases_ended_total{reason="released"}`: 1,
		"leasefs_lock_wait_seconds_count":               1,
	})
}

// Refusals are counted by operation and errno name, conflicts apart from
// misuse and failures; EWOULDBLOCK is EAGAIN.
func TestRefusals(t *testing.T) {
	reg := New(Options{Logger: quiet})
	reg.Refused("create", syscall.EEXIST)
	reg.Refused("create", syscall.EEXIST)
	reg.Refused("flock", syscall.EWOULDBLOCK)
	reg.Refused("flock", syscall.EINTR)
	reg.Refused("write", syscall.EACCES)
	reg.Refused("create", syscall.ENOSPC)
	reg.Refused("write", syscall.Errno(4095))
	got, body := scrape(t, reg.Handler())
	want := map[string]float64{
		`leasefs_conflicts_total{errno="EEXIST",op="create"}`:   2,
		`leasefs_conflicts_total{errno="EAGAIN",op="flock"}`:    1,
		`leasefs_conflicts_total{errno="EINTR",op="flock"}`:     1,
		`leasefs_refusals_total{errno="EACCES",op="write"}`:     1,
		`leasefs_refusals_total{errno="ENOSPC",op="create"}`:    1,
		`leasefs_refusals_total{errno="errno 4095",op="write"}`: 1,
	}
	for series, v := range got {
		if strings.HasPrefix(series, "leasefs_conflicts_total{") || strings.HasPrefix(series, "leasefs_refusals_total{") {
			if _, ok := want[series]; !ok {
				t.Errorf("unexpected series %s = %v", series, v)
			}
		}
	}
	for series, v := range want {
		if got[series] != v {
			t.Errorf("%s = %v, want %v", series, got[series], v)
		}
	}
	for _, family := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := got[family]; !ok {
			t.Errorf("scrape lacks %s of the runtime and process collectors:\n%s", family, body)
		}
	}
	if strings.Contains(body, "leasefs_live_leases") {
		t.Errorf("a registry that follows no store reports live leases:\n%s", body)
	}
}

// Follow works once; a closed store leaves its gauges out of a scrape,
// which still serves the rest.
func TestFollowOnceAndClosedStore(t *testing.T) {
	e := newEnv(t)
	if err := e.reg.Follow(context.Background(), e.store); !errors.Is(err, ErrFollowing) {
		t.Fatalf("second Follow = %v, want ErrFollowing", err)
	}
	e.reserve(t, "x", leasecore.ModeToken)
	waitSamples(t, e.reg.Handler(), map[string]float64{"leasefs_leases_reserved_total": 1})
	if err := e.store.Close(); err != nil {
		t.Fatal(err)
	}
	got, body := scrape(t, e.reg.Handler())
	if _, ok := got[`leasefs_live_leases{mode="token"}`]; ok {
		t.Errorf("a closed store's gauges were served:\n%s", body)
	}
	if got["leasefs_leases_reserved_total"] != 1 {
		t.Errorf("after the store closed, leasefs_leases_reserved_total = %v, want 1", got["leasefs_leases_reserved_total"])
	}
}

// A file store has leasefs_store_lagging_records, and it is 0 only once the
// records of its changes are in their files; a store that writes nothing
// behind (the memory store) has no such series.
func TestLaggingRecords(t *testing.T) {
	if _, body := scrape(t, newEnv(t).reg.Handler()); strings.Contains(body, "leasefs_store_lagging_records") {
		t.Errorf("the memory store's scrape has leasefs_store_lagging_records:\n%s", body)
	}
	reg := New(Options{Logger: quiet})
	state := t.TempDir()
	store, err := filestore.Open(state, filestore.Options{Options: leasecore.Options{Host: "testhost", LeaseDuration: leaseDuration, Logger: quiet}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := reg.Follow(ctx, store); err != nil {
		t.Fatal(err)
	}
	h := reg.Handler()
	waitSamples(t, h, map[string]float64{"leasefs_store_lagging_records": 0})
	for _, r := range []string{"a", "b", "c"} {
		if _, err := store.Reserve(context.Background(), leasecore.Draft{Resource: r, Mode: leasecore.ModeToken, HolderUID: 1000, HolderGID: 1000}); err != nil {
			t.Fatal(err)
		}
	}
	waitSamples(t, h, map[string]float64{"leasefs_store_lagging_records": 0})
	// 0 means the record files say what the journal does: all three are
	// written.
	records, err := filepath.Glob(filepath.Join(state, filestore.LeasesDir, "lease-*.toml"))
	if err != nil || len(records) != 3 {
		t.Errorf("with leasefs_store_lagging_records 0, the record files are %v (%v), want 3", records, err)
	}
}
