package integration

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/internal/testenv"
)

// TestEtcdTwoMounts serves one etcd store (docs/PROTOCOL.md §8a) through
// two daemons on two mountpoints: a lease reserved through one mount is
// visible through the other at once and blocks an exclusive create there;
// its release through the first lets the second reserve.
func TestEtcdTwoMounts(t *testing.T) {
	store, a, b := startTwoEtcdDaemons(t, "/leasefs-it")
	pa, pb := filepath.Join(a.mountpoint, "shared"), filepath.Join(b.mountpoint, "shared")

	// B looks the name up first: a cached "no such file" must not hide
	// A's lease.
	if _, err := os.Stat(pb); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat through B before any lease: %v, want ENOENT", err)
	}
	f, err := os.OpenFile(pa, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("reserve through A: %v", err)
	}
	f.Close()
	readToken(t, pa) // the first read by the holder is the token
	stA, _ := statusDoc(t, pa)
	stB, _ := statusDoc(t, pb)
	if stB["lease_id"] == "" || stB["lease_id"] != stA["lease_id"] || stB["generation"] != stA["generation"] {
		t.Fatalf("through B the lease is %v, through A %v; want the same lease", stB, stA)
	}
	if ls := mustSh(t, `ls "$M"`, "M="+b.mountpoint).stdout; strings.TrimSpace(ls) != "shared" {
		t.Errorf("ls through B = %q, want shared", ls)
	}
	ls := runClient(t, nil, append([]string{leasefsBin, "ls", "--json"}, store...)...)
	if ls.code != 0 || !strings.Contains(ls.stdout, stA["lease_id"]) {
		t.Errorf("leasefs ls --store etcd://… does not list the lease: %s", ls)
	}
	_, err = os.OpenFile(pb, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if !errors.Is(err, fs.ErrExist) {
		t.Fatalf("O_EXCL create through B while A holds the lease: %v, want EEXIST", err)
	}

	if err := os.Remove(pa); err != nil {
		t.Fatalf("release through A: %v", err)
	}
	g, err := os.OpenFile(pb, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("O_EXCL create through B after A released: %v", err)
	}
	g.Close()
	readToken(t, pb)
	stA2, _ := statusDoc(t, pa)
	if stA2["lease_id"] == stA["lease_id"] || stA2["holder_uid"] == "" {
		t.Fatalf("through A after B reserved: %v; want B's new lease", stA2)
	}

	// Handle leases: a flock through A excludes one through B, and a
	// blocked flock through B is granted when A's open file closes.
	la, err := os.OpenFile(filepath.Join(a.mountpoint, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer la.Close()
	if err := syscall.Flock(int(la.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("flock through A: %v", err)
	}
	lb, err := os.OpenFile(filepath.Join(b.mountpoint, "lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open through B of A's handle lease: %v", err)
	}
	defer lb.Close()
	if err := syscall.Flock(int(lb.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("flock -n through B while A holds: %v, want EWOULDBLOCK", err)
	}
	granted := make(chan error, 1)
	go func() { granted <- syscall.Flock(int(lb.Fd()), syscall.LOCK_EX) }()
	la.Close()
	select {
	case err := <-granted:
		if err != nil {
			t.Fatalf("blocking flock through B: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the blocked flock through B was not granted after A closed its file")
	}
	lb.Close()

	for _, d := range []*daemon{a, b} {
		if code := d.stop(true); code != 0 {
			t.Errorf("daemon on %s exited %d; stderr:\n%s", d.mountpoint, code, d.stderr())
		}
	}
}

// When the daemon loses the etcd cluster for longer than the lease
// duration, the handle lease of `leasefs lock` ends: the command gets
// SIGTERM and lock exits 4, as when the daemon stops (docs/PROTOCOL.md
// §8a). The loss is one log line and shows in the metrics.
func TestEtcdLockLostWithCluster(t *testing.T) {
	testenv.RequireFUSE(t)
	srv := etcdtest.Start(t)
	proxy := etcdtest.NewProxy(t, srv.Endpoint())
	d := startDaemon(t, daemonOpts{leaseDuration: 2 * time.Second, metricsAddr: "127.0.0.1:0",
		extraArgs: []string{"--store", "etcd://" + proxy.Endpoint() + "/leasefs-lost"}})
	url := d.metricsURL(t)
	waitMetrics(t, url, "with the cluster", map[string]float64{
		"leasefs_store_reachable":               1,
		"leasefs_store_unreachable_calls_total": 0,
	})
	p := startProc(t, []string{"LEASEFS_MOUNT=" + d.mountpoint}, leasefsBin, "lock", "--grace", "5s", "job", "--",
		"bash", "-c", `trap 'echo got-term; exit 0' TERM; echo running; while :; do sleep 0.05; done`)
	p.expect(`(?m)^running$`, holdTimeout)
	cut := time.Now()
	proxy.Cut()
	r := p.wait(20 * time.Second)
	if r.code != 4 || !strings.Contains(r.stdout, "got-term") {
		t.Fatalf("lock whose daemon lost the cluster: exit %d, want 4 after the command got SIGTERM: %s", r.code, r)
	}
	t.Logf("lock was told %v after the cluster went away (lease duration 2s)", time.Since(cut).Round(10*time.Millisecond))
	eventually(t, 30*time.Second, "the metrics show the cluster unreachable", func() (bool, string) {
		got, body := scrapeMetrics(t, url)
		return got["leasefs_store_reachable"] == 0 && got["leasefs_store_unreachable_calls_total"] >= 1, body
	})
	if n := strings.Count(d.stderr(), "etcd cluster unreachable"); n != 1 {
		t.Errorf("the daemon logged the lost cluster %d times, want once:\n%s", n, d.stderr())
	}
	began := time.Now()
	d.stop(false)
	t.Logf("the daemon stopped in %v without its cluster", time.Since(began).Round(10*time.Millisecond))
}

// Daemons that share an etcd store settle, when they start, hand over or
// stop, only the handle leases held through their own mounts
// (docs/PROTOCOL.md §2, §8a, §8b): A and B each hold one; C takes over from
// B and keeps B's lease, whose holder still has its open file, and knows
// nothing of A's; then A stops, logging its own lease and not the one held
// through C.
func TestEtcdDaemonEndsOnlyItsOwnHandleLeases(t *testing.T) {
	store, a, b := startTwoEtcdDaemons(t, "/leasefs-own")
	lock := func(d *daemon, name string) (*os.File, string) {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(d.mountpoint, name), os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			t.Fatalf("flock %s: %v", name, err)
		}
		st, _ := statusDoc(t, filepath.Join(d.mountpoint, name))
		return f, st["lease_id"]
	}
	fa, idA := lock(a, "held-via-a")
	_, idB := lock(b, "held-via-b")

	c := startDaemon(t, daemonOpts{mountpoint: b.mountpoint, state: b.state, takeover: true, extraArgs: store})
	if code, exited := b.waitExit(15 * time.Second); !exited || code != 0 {
		t.Fatalf("daemon B after the handover: exited %v, code %d; stderr:\n%s", exited, code, b.stderr())
	}
	if st, _ := statusDoc(t, filepath.Join(a.mountpoint, "held-via-a")); st["lease_id"] != idA || st["status"] != "active" {
		t.Fatalf("A's handle lease after B handed over: %v, want %s active", st, idA)
	}
	if _, err := fa.ReadAt(make([]byte, 64), 0); err != nil && !errors.Is(err, io.EOF) {
		t.Errorf("A's holder reads its descriptor after B handed over: %v, want its status document", err)
	}
	// B's holder still has its open file: C, the same daemon identity,
	// keeps the lease alive (docs/PROTOCOL.md §2, §8a).
	if st, _ := statusDoc(t, filepath.Join(c.mountpoint, "held-via-b")); st["lease_id"] != idB || st["status"] != "active" || st["daemon"] != "previous" {
		t.Errorf("B's handle lease after C took over: %v, want %s active, daemon = previous", st, idB)
	}
	if strings.Contains(c.stderr(), idA) || !strings.Contains(c.stderr(), idB) {
		t.Errorf("C's start log: want B's handle lease %s kept and nothing of A's %s; stderr:\n%s", idB, idA, c.stderr())
	}

	_, idC := lock(c, "held-via-c")
	if code := a.stop(true); code != 0 {
		t.Fatalf("daemon A exited %d; stderr:\n%s", code, a.stderr())
	}
	if !strings.Contains(a.stderr(), idA) || strings.Contains(a.stderr(), idC) {
		t.Errorf("A's stop warnings: want its own handle lease %s and not C's %s; stderr:\n%s", idA, idC, a.stderr())
	}
	if st, _ := statusDoc(t, filepath.Join(c.mountpoint, "held-via-c")); st["lease_id"] != idC || st["status"] != "active" {
		t.Errorf("C's handle lease after A stopped: %v, want %s active", st, idC)
	}
	if code := c.stop(true); code != 0 {
		t.Errorf("daemon C exited %d; stderr:\n%s", code, c.stderr())
	}
}

// startTwoEtcdDaemons starts an embedded etcd server and two daemons that
// share its key prefix, and returns the --store flags that name it.
func startTwoEtcdDaemons(t *testing.T, prefix string) (store []string, a, b *daemon) {
	t.Helper()
	testenv.RequireFUSE(t)
	srv := etcdtest.Start(t)
	store = []string{"--store", "etcd://" + srv.Endpoint() + prefix}
	return store, startDaemon(t, daemonOpts{extraArgs: store}), startDaemon(t, daemonOpts{extraArgs: store})
}
