package etcdstore

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/internal/testenv"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/mount"
)

// rpcCounter counts the calls a store's client makes to the cluster: unary
// calls by method, and messages sent on streams by method (a keep-alive is
// one message on a LeaseKeepAlive stream). Background work is left out:
// what the store marks as such (the keep-alives of its handle session, a
// bucket granted ahead of need, history pruning, see [background]) and the
// keep-alives of its session lease of waiter keys. Safe for concurrent use.
type rpcCounter struct {
	mu      sync.Mutex
	unary   map[string]int
	stream  map[string]int
	session atomic.Int64 // the session lease's id, whose keep-alives are background
	// kept counts every keep-alive message by the etcd lease it names,
	// background ones included.
	kept map[int64]int
	// bgWrites counts the background unary calls that may write (a
	// bucket's Grant, a pruning transaction).
	bgWrites int
}

func newRPCCounter() *rpcCounter {
	return &rpcCounter{unary: map[string]int{}, stream: map[string]int{}, kept: map[int64]int{}}
}

// dialOptions returns the interceptors that feed c.
func (c *rpcCounter) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if isBackground(ctx) {
				if !strings.HasSuffix(method, "/Range") && !strings.HasSuffix(method, "/LeaseTimeToLive") {
					c.mu.Lock()
					c.bgWrites++
					c.mu.Unlock()
				}
			} else {
				c.add(c.unary, method)
				if os.Getenv("COSTTRACE") != "" {
					fmt.Fprintf(os.Stderr, "CALL %s %s\n", method, callers())
				}
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			cs, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, err
			}
			return &countedStream{ClientStream: cs, c: c, method: method, background: isBackground(ctx)}, nil
		}),
	}
}

func (c *rpcCounter) add(m map[string]int, method string) {
	c.mu.Lock()
	m[method[strings.LastIndex(method, "/")+1:]]++
	c.mu.Unlock()
}

func callers() string {
	pc := make([]uintptr, 40)
	n := runtime.Callers(3, pc)
	fr := runtime.CallersFrames(pc[:n])
	var out []string
	for {
		f, more := fr.Next()
		if strings.Contains(f.Function, "leasefs/") && !strings.Contains(f.Function, "cost_test") {
			out = append(out, f.Function[strings.LastIndex(f.Function, "/")+1:])
		}
		if !more {
			break
		}
	}
	return strings.Join(out, " < ")
}

type countedStream struct {
	grpc.ClientStream
	c          *rpcCounter
	method     string
	background bool // opened by background work
}

func (s *countedStream) SendMsg(m any) error {
	ka, ok := m.(*pb.LeaseKeepAliveRequest)
	if !s.background && (!ok || ka.ID != s.c.session.Load()) {
		s.c.add(s.c.stream, s.method)
	}
	if ok {
		s.c.mu.Lock()
		s.c.kept[ka.ID]++
		s.c.mu.Unlock()
	}
	return s.ClientStream.SendMsg(m)
}

// cost is what one workload cost the cluster.
type cost struct {
	writes uint64 // raft proposals committed
	// background is the part of writes that was background work: the
	// store's background calls that may write, and the leases the server
	// revoked at expiry.
	background uint64
	unary      map[string]int // unary calls by method
	keepAlive  int            // keep-alive messages
	watches    int            // watch requests (create or cancel)
}

func (c cost) calls() int {
	n := 0
	for _, v := range c.unary {
		n += v
	}
	return n
}

func (c cost) String() string {
	var ms []string
	for m, n := range c.unary {
		ms = append(ms, fmt.Sprintf("%s %d", m, n))
	}
	slices.Sort(ms)
	bg := ""
	if c.background > 0 {
		bg = fmt.Sprintf(" (%d of them background)", c.background)
	}
	return fmt.Sprintf("%d writes%s, %d unary calls (%s), %d keep-alives, %d watch requests",
		c.writes, bg, c.calls(), strings.Join(ms, ", "), c.keepAlive, c.watches)
}

// measure runs work and returns what it cost, once the store's calls that
// work started (a background revoke, a watch event's follow-up) have
// settled: nothing new for 300 ms.
func measure(t *testing.T, srv *etcdtest.Server, c *rpcCounter, work func()) cost {
	t.Helper()
	return measureAll(t, srv, []*rpcCounter{c}, work)[0]
}

// measureAll is measure for the stores of several daemons: the cost of
// work to each (writes are the cluster's, the same in every element).
func measureAll(t *testing.T, srv *etcdtest.Server, cs []*rpcCounter, work func()) []cost {
	t.Helper()
	type state struct {
		u, s     map[string]int
		bgWrites int
	}
	expired0 := srv.LeasesExpired()
	snap := func() (uint64, []state) {
		var out []state
		for _, c := range cs {
			c.mu.Lock()
			out = append(out, state{maps(c.unary), maps(c.stream), c.bgWrites})
			c.mu.Unlock()
		}
		return srv.CommittedIndex(), out
	}
	same := func(a, b []state) bool {
		for i := range a {
			if !mapsEqual(a[i].u, b[i].u) || !mapsEqual(a[i].s, b[i].s) || a[i].bgWrites != b[i].bgWrites {
				return false
			}
		}
		return true
	}
	settle := func() (uint64, []state) {
		w, st := snap()
		for still := time.Now(); time.Since(still) < 300*time.Millisecond; {
			time.Sleep(20 * time.Millisecond)
			w2, st2 := snap()
			if w2 != w || !same(st, st2) {
				w, st, still = w2, st2, time.Now()
			}
		}
		return w, st
	}
	w0, st0 := settle()
	work()
	w1, st1 := settle()
	expired := srv.LeasesExpired() - expired0
	out := make([]cost, len(cs))
	for i := range cs {
		bg := expired
		for j := range cs {
			bg += uint64(st1[j].bgWrites - st0[j].bgWrites)
		}
		out[i] = cost{writes: w1 - w0, background: min(bg, w1-w0), unary: map[string]int{}}
		for m, n := range st1[i].u {
			if d := n - st0[i].u[m]; d > 0 {
				out[i].unary[m] = d
			}
		}
		out[i].keepAlive = st1[i].s["LeaseKeepAlive"] - st0[i].s["LeaseKeepAlive"]
		out[i].watches = st1[i].s["Watch"] - st0[i].s["Watch"]
	}
	return out
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// mountEtcd mounts, in this process, a daemon serving an etcd store on srv
// (prefix /cost) with leaseDuration, whose client calls c counts, and
// unmounts it when t ends. It returns the mountpoint and the store.
func mountEtcd(t *testing.T, srv *etcdtest.Server, c *rpcCounter, leaseDuration time.Duration) (string, *Store) {
	t.Helper()
	testenv.RequireFUSE(t)
	state, mp := t.TempDir(), t.TempDir()
	ready := make(chan *Store, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	mounted := make(chan struct{})
	go func() {
		done <- mount.Run(ctx, mount.Options{
			Mountpoint: mp, StateDir: state, LeaseDuration: leaseDuration,
			Logger:    slog.New(slog.DiscardHandler),
			StoreName: "etcd://" + srv.Endpoint() + "/cost",
			OnReady:   func() { close(mounted) },
			OpenStore: func(ctx context.Context, log *slog.Logger, hooks mount.StoreHooks) (leasecore.Store, error) {
				s, err := Open(ctx, []string{srv.Endpoint()}, "/cost", Options{
					Options:     leasecore.Options{LeaseDuration: leaseDuration, Logger: log, OnCommit: hooks.OnCommit, HandleHolders: hooks.HandleHolders},
					KernelKnows: hooks.KernelKnows,
					DialOptions: c.dialOptions(),
				})
				if err == nil {
					ready <- s
				}
				return s, err
			},
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Errorf("the daemon did not stop within 20 s of its context ending")
		}
	})
	var s *Store
	select {
	case s = <-ready:
		c.session.Store(int64(s.sessionID()))
	case err := <-done:
		t.Fatalf("the daemon stopped before serving: %v", err)
	}
	select {
	case <-mounted:
	case err := <-done:
		t.Fatalf("the daemon stopped before mounting: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("not mounted within 20 s")
	}
	return mp, s
}

// budget is what a workload may cost (docs/ARCHITECTURE.md, "What a system
// call costs").
type budget struct {
	writes    uint64
	calls     int
	keepAlive int
}

// TestSystemCallCost runs each workload of a lease's life through a real
// mount of the etcd store and counts what it cost the cluster: raft
// proposals from the member's commit index, unary calls and keep-alive
// messages from interceptors on the store's client. Each workload must
// stay within its budget, the table of docs/PROTOCOL.md §8a, at the root
// of the mount and in namespaces one and three deep.
func TestSystemCallCost(t *testing.T) {
	srv := etcdtest.Start(t)
	c := newRPCCounter()
	mp, _ := mountEtcd(t, srv, c, 30*time.Second)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	// The same workloads at the root, in a namespace and three namespaces
	// deep: a namespace costs nothing (docs/PROTOCOL.md §8a).
	for _, dir := range []string{"", "ns", "ns/a/b"} {
		if dir != "" {
			must("mkdir", os.MkdirAll(filepath.Join(mp, dir), 0o777))
		}
		t.Run(fmt.Sprintf("depth %d", strings.Count(dir, "/")+min(len(dir), 1)), func(t *testing.T) {
			systemCallCost(t, srv, c, filepath.Join(mp, dir))
		})
	}
}

// systemCallCost runs the workloads of [TestSystemCallCost] in directory
// dir of a mount.
func systemCallCost(t *testing.T, srv *etcdtest.Server, c *rpcCounter, dir string) {
	p := func(name string) string { return filepath.Join(dir, name) }
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	readAll := func(fd int) string {
		var b []byte
		buf := make([]byte, 4096)
		for {
			n, err := syscall.Read(fd, buf)
			must("read", err)
			if n == 0 {
				return string(b)
			}
			b = append(b, buf[:n]...)
		}
	}

	// A held token lease for renew, stat and cat.
	held, err := syscall.Open(p("held"), syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDWR, 0o644)
	must("create held", err)
	defer syscall.Close(held)
	token := strings.TrimSpace(readAll(held))

	workloads := []struct {
		name string
		max  budget
		work func()
	}{
		{"lease cycle (create, read token, close, unlink)", budget{2, 4, 0}, func() {
			fd, err := syscall.Open(p("cycle"), syscall.O_CREAT|syscall.O_EXCL|syscall.O_RDWR, 0o644)
			must("create", err)
			readAll(fd)
			must("close", syscall.Close(fd))
			must("unlink", syscall.Unlink(p("cycle")))
		}},
		{"renew (write the token through an open descriptor)", budget{1, 1, 0}, func() {
			_, err := syscall.Pwrite(held, []byte(token+"\n"), 0)
			must("renew", err)
		}},
		// A cycle on a name whose previous cycle ended a moment ago costs
		// one more read: the kernel still holds the ended lease's entry,
		// which the LOOKUP that revalidates it drops, and it looks the
		// name up again before it creates (docs/PROTOCOL.md §8a).
		{"handle cycle (open O_CREAT, flock, unlock, close)", budget{3, 5, 0}, func() {
			fd, err := syscall.Open(p("handle"), syscall.O_CREAT|syscall.O_RDWR, 0o644)
			must("open", err)
			must("flock", syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB))
			must("unlock", syscall.Flock(fd, syscall.LOCK_UN))
			must("close", syscall.Close(fd))
		}},
		{"stat", budget{0, 1, 0}, func() {
			var st syscall.Stat_t
			must("stat", syscall.Stat(p("held"), &st))
		}},
		{"cat (open, reads, close)", budget{0, 1, 0}, func() {
			fd, err := syscall.Open(p("held"), syscall.O_RDONLY, 0)
			must("open", err)
			readAll(fd)
			must("close", syscall.Close(fd))
		}},
		{"mkdir and rmdir of a namespace", budget{2, 5, 0}, func() {
			must("mkdir", syscall.Mkdir(p("sub"), 0o777))
			must("rmdir", syscall.Rmdir(p("sub")))
		}},
	}
	// Each workload runs once, then n times back to back, as the bench
	// runs it: the budget holds for both, per operation.
	const n = 10
	for _, w := range workloads {
		for _, times := range []int{1, n} {
			got := measure(t, srv, c, func() {
				for range times {
					w.work()
				}
			})
			t.Logf("%s, %d times: %s", w.name, times, got)
			if got.writes-got.background > uint64(times)*w.max.writes || got.calls() > times*w.max.calls || got.keepAlive > times*w.max.keepAlive {
				t.Errorf("%s, %d times, cost %s; budget %d writes, %d unary calls, %d keep-alives each", w.name, times, got, w.max.writes, w.max.calls, w.max.keepAlive)
			}
		}
	}
}

// queued returns how many waiter keys of resource s's watch has shown.
func queued(s *Store, resource string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue[resource])
}

// TestHandOverCost counts a hand-over to the next queued waiter: the end's
// transaction and the head's reservation, and nothing from the daemon of
// a waiter further back (docs/PROTOCOL.md §8a). Daemon A holds the name
// and queues the head waiter; daemon B queues the second.
func TestHandOverCost(t *testing.T) {
	srv := etcdtest.Start(t)
	ca, cb := newRPCCounter(), newRPCCounter()
	mpa, sa := mountEtcd(t, srv, ca, 30*time.Second)
	mpb, sb := mountEtcd(t, srv, cb, 30*time.Second)
	open := func(mp string) int {
		fd, err := syscall.Open(filepath.Join(mp, "q"), syscall.O_CREAT|syscall.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Close(fd) })
		return fd
	}
	holder, head, second := open(mpa), open(mpa), open(mpb)
	if err := syscall.Flock(holder, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	locked := func(fd int) chan error {
		ch := make(chan error, 1)
		go func() { ch <- syscall.Flock(fd, syscall.LOCK_EX) }()
		return ch
	}
	headDone := locked(head)
	testenv.WaitFor(t, "the head waiter queues", func() bool { return queued(sa, "q") == 1 && queued(sb, "q") == 1 })
	secondDone := locked(second)
	testenv.WaitFor(t, "the second waiter queues", func() bool { return queued(sa, "q") == 2 && queued(sb, "q") == 2 })

	got := measureAll(t, srv, []*rpcCounter{ca, cb}, func() {
		if err := syscall.Flock(holder, syscall.LOCK_UN); err != nil {
			t.Fatal(err)
		}
		awaitGrant(t, headDone, "the head waiter")
	})
	t.Logf("hand-over: daemon of the holder and the head: %s; daemon of the second waiter: %s", got[0], got[1])
	// A self-unlink of the ended lease looks the name up in the store's
	// own view (docs/PROTOCOL.md §6a): it costs the cluster nothing.
	if got[0].writes-got[0].background > 2 || got[0].calls() > 3 {
		t.Errorf("hand-over cost %s; budget 2 writes, 3 unary calls", got[0])
	}
	if got[1].calls() != 0 || got[1].keepAlive != 0 {
		t.Errorf("the daemon of the second waiter made calls at a hand-over that was not its own: %s", got[1])
	}
	select {
	case err := <-secondDone:
		t.Fatalf("the second waiter's flock returned (%v) while the head holds the name", err)
	default:
	}
	syscall.Close(head)
	awaitGrant(t, secondDone, "the second waiter")
}

// awaitGrant waits up to 20 s for the blocking flock of who to answer on
// done, and fails t unless it was granted.
func awaitGrant(t *testing.T, done <-chan error, who string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s's flock: %v", who, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("%s was not granted the name within 20 s", who)
	}
}

// TestIdleHandleLeasesKeepAlive: the handle leases of one daemon share its
// handle session, so holding 16 costs the keep-alives of one etcd lease,
// as holding one does, and no call (docs/PROTOCOL.md §8a).
func TestIdleHandleLeasesKeepAlive(t *testing.T) {
	srv := etcdtest.Start(t)
	c := newRPCCounter()
	const d = 3 * time.Second // keep-alives every d/6
	mp, s := mountEtcd(t, srv, c, d)
	held := 0
	hold := func(n int) {
		for range n {
			held++
			fd, err := syscall.Open(filepath.Join(mp, fmt.Sprintf("idle-%d", held)), syscall.O_CREAT|syscall.O_RDWR, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Close(fd) })
			if err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
				t.Fatal(err)
			}
		}
	}
	kept := func() map[int64]int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return maps64(c.kept)
	}
	window := func(n int) (map[int64]int, cost) {
		hold(n)
		before := kept()
		got := measure(t, srv, c, func() { time.Sleep(4 * keepAliveEvery(d)) })
		after := kept()
		delta := map[int64]int{}
		for id, k := range after {
			if k > before[id] {
				delta[id] = k - before[id]
			}
		}
		return delta, got
	}
	one, costOne := window(1)
	many, costMany := window(15) // 16 held now
	s.mu.Lock()
	hs, session := int64(s.hs.id), int64(s.session)
	s.mu.Unlock()
	t.Logf("keep-alives by etcd lease while holding 1: %v (%s); while holding 16: %v (%s); handle session %x, waiter session %x",
		one, costOne, many, costMany, hs, session)
	for _, w := range []struct {
		n    int
		kept map[int64]int
		cost cost
	}{{1, one, costOne}, {16, many, costMany}} {
		if w.cost.writes != w.cost.background || w.cost.calls() != 0 {
			t.Errorf("holding %d idle handle leases cost %s, want nothing", w.n, w.cost)
		}
		for id := range w.kept {
			if id != hs && id != session {
				t.Errorf("holding %d handle leases kept etcd lease %x alive: only the handle session %x (and the waiter session %x) should be", w.n, id, hs, session)
			}
		}
		if w.kept[hs] == 0 {
			t.Errorf("holding %d handle leases: no keep-alive of the handle session %x in %v", w.n, hs, 4*keepAliveEvery(d))
		}
	}
}

func maps64(m map[int64]int) map[int64]int {
	out := make(map[int64]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
