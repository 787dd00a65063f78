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
}

func newRPCCounter() *rpcCounter {
	return &rpcCounter{unary: map[string]int{}, stream: map[string]int{}}
}

// dialOptions returns the interceptors that feed c.
func (c *rpcCounter) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if !isBackground(ctx) {
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
	if ka, ok := m.(*pb.LeaseKeepAliveRequest); !s.background && (!ok || ka.ID != s.c.session.Load()) {
		s.c.add(s.c.stream, s.method)
	}
	return s.ClientStream.SendMsg(m)
}

// cost is what one workload cost the cluster.
type cost struct {
	writes    uint64         // raft proposals committed
	unary     map[string]int // unary calls by method
	keepAlive int            // keep-alive messages
	watches   int            // watch requests (create or cancel)
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
	return fmt.Sprintf("%d writes, %d unary calls (%s), %d keep-alives, %d watch requests",
		c.writes, c.calls(), strings.Join(ms, ", "), c.keepAlive, c.watches)
}

// measure runs work and returns what it cost, once the store's calls that
// work started (a background revoke, a watch event's follow-up) have
// settled: nothing new for 300 ms.
func measure(t *testing.T, srv *etcdtest.Server, c *rpcCounter, work func()) cost {
	t.Helper()
	snap := func() (uint64, map[string]int, map[string]int) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return srv.CommittedIndex(), maps(c.unary), maps(c.stream)
	}
	settle := func() (uint64, map[string]int, map[string]int) {
		w, u, s := snap()
		for still := time.Now(); time.Since(still) < 300*time.Millisecond; {
			time.Sleep(20 * time.Millisecond)
			w2, u2, s2 := snap()
			if w2 != w || !mapsEqual(u, u2) || !mapsEqual(s, s2) {
				w, u, s, still = w2, u2, s2, time.Now()
			}
		}
		return w, u, s
	}
	w0, u0, s0 := settle()
	work()
	w1, u1, s1 := settle()
	out := cost{writes: w1 - w0, unary: map[string]int{}}
	for m, n := range u1 {
		if d := n - u0[m]; d > 0 {
			out.unary[m] = d
		}
	}
	out.keepAlive = s1["LeaseKeepAlive"] - s0["LeaseKeepAlive"]
	out.watches = s1["Watch"] - s0["Watch"]
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

// requireFUSE skips the test unless it can mount (root, /dev/fuse), or
// fails it when LEASEFS_REQUIRE_FUSE=1.
func requireFUSE(t *testing.T) {
	t.Helper()
	why := ""
	if _, err := os.Stat("/dev/fuse"); err != nil {
		why = "FUSE unavailable: " + err.Error()
	} else if os.Geteuid() != 0 {
		why = "mounting in-process needs root"
	}
	if why == "" {
		return
	}
	if os.Getenv("LEASEFS_REQUIRE_FUSE") == "1" {
		t.Fatal("LEASEFS_REQUIRE_FUSE=1 but " + why)
	}
	t.Skip(why)
}

// mountEtcd mounts, in this process, a daemon serving an etcd store on srv
// whose client calls c counts, and unmounts it when t ends. It returns the
// mountpoint.
func mountEtcd(t *testing.T, srv *etcdtest.Server, c *rpcCounter) string {
	t.Helper()
	requireFUSE(t)
	state, mp := t.TempDir(), t.TempDir()
	ready := make(chan *Store, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	mounted := make(chan struct{})
	go func() {
		done <- mount.Run(ctx, mount.Options{
			Mountpoint: mp, StateDir: state, LeaseDuration: 30 * time.Second,
			Logger:    slog.New(slog.DiscardHandler),
			StoreName: "etcd://" + srv.Endpoint() + "/cost",
			OnReady:   func() { close(mounted) },
			OpenStore: func(ctx context.Context, log *slog.Logger, hooks mount.StoreHooks) (leasecore.Store, error) {
				s, err := Open(ctx, []string{srv.Endpoint()}, "/cost", Options{
					Options:     leasecore.Options{LeaseDuration: 30 * time.Second, Logger: log, OnCommit: hooks.OnCommit, HandleHolders: hooks.HandleHolders},
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
	select {
	case s := <-ready:
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
	return mp
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
// stay within its budget.
func TestSystemCallCost(t *testing.T) {
	srv := etcdtest.Start(t)
	c := newRPCCounter()
	mp := mountEtcd(t, srv, c)
	p := func(name string) string { return filepath.Join(mp, name) }
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
		{"handle cycle (open O_CREAT, flock, unlock, close)", budget{3, 5, 1}, func() {
			fd, err := syscall.Open(p("handle"), syscall.O_CREAT|syscall.O_RDWR, 0o644)
			must("open", err)
			must("flock", syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB))
			must("unlock", syscall.Flock(fd, syscall.LOCK_UN))
			must("close", syscall.Close(fd))
		}},
		{"stat", budget{0, 2, 0}, func() {
			var st syscall.Stat_t
			must("stat", syscall.Stat(p("held"), &st))
		}},
		{"cat (open, reads, close)", budget{0, 3, 0}, func() {
			fd, err := syscall.Open(p("held"), syscall.O_RDONLY, 0)
			must("open", err)
			readAll(fd)
			must("close", syscall.Close(fd))
		}},
	}
	over := false
	for _, w := range workloads {
		got := measure(t, srv, c, w.work)
		t.Logf("%s: %s", w.name, got)
		if got.writes > w.max.writes || got.calls() > w.max.calls || got.keepAlive > w.max.keepAlive {
			t.Errorf("%s cost %s; budget %d writes, %d unary calls, %d keep-alives", w.name, got, w.max.writes, w.max.calls, w.max.keepAlive)
			over = true
		}
	}
	_ = over
}
