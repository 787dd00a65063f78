package etcdtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// StartCluster starts an n-member etcd cluster in the test process, each
// member with its data in a temporary directory of t and its client and
// peer listeners on loopback ports, waits until every member serves (at
// most 30 s) and arranges for all of them to be stopped when t ends. It
// fails t when a member cannot start.
//
// The election timings (50 ms ticks, 500 ms election timeout) elect a new
// leader within about a second of the leader's [Server.Stop].
func StartCluster(t testing.TB, n int) []*Server {
	t.Helper()
	return StartClusterElection(t, n, 500*time.Millisecond)
}

// StartClusterElection is [StartCluster] with an election timeout of
// election (heartbeats every tenth of it): etcd's defaults are 1 s and
// 100 ms. A follower starts an election between election and twice
// election after it last heard from the leader.
func StartClusterElection(t testing.TB, n int, election time.Duration) []*Server {
	t.Helper()
	// The initial cluster names every peer URL before any member starts,
	// so the ports are chosen first: free ports the kernel gives and that
	// are closed again at once (another process could take one meanwhile;
	// on loopback in a test that is rare enough).
	ports := freePorts(t, 2*n)
	cfgs := make([]*embed.Config, n)
	var initial []string
	for i := range n {
		cfg := embed.NewConfig()
		cfg.Name = fmt.Sprintf("m%d", i)
		cfg.Dir = t.TempDir()
		cfg.Logger = "zap"
		cfg.LogLevel = "fatal"
		cfg.LogOutputs = []string{"stderr"}
		client := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i])}
		peer := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
		cfg.ElectionMs = uint(election / time.Millisecond)
		cfg.TickMs = max(cfg.ElectionMs/10, 1)
		cfg.InitialClusterToken = "etcdtest"
		initial = append(initial, cfg.Name+"="+peer.String())
		cfgs[i] = cfg
	}
	servers := make([]*Server, n)
	for i, cfg := range cfgs {
		cfg.InitialCluster = strings.Join(initial, ",")
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			t.Fatalf("etcdtest: start member %s: %v", cfg.Name, err)
		}
		servers[i] = &Server{etcd: e, last: e, cfg: cfg, endpoint: e.Clients[0].Addr().String()}
		t.Cleanup(servers[i].Stop)
	}
	deadline := time.After(30 * time.Second)
	for _, s := range servers {
		select {
		case <-s.member().Server.ReadyNotify():
		case <-deadline:
			t.Fatal("etcdtest: the cluster did not become ready within 30s")
		}
	}
	return servers
}

// freePorts returns n distinct TCP ports of 127.0.0.1 that were free a
// moment ago.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, n)
	for i := range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("etcdtest: find a free port: %v", err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// IsLeader reports whether the member is the raft leader of its cluster
// now; false once it is stopped.
func (s *Server) IsLeader() bool {
	e := s.member()
	select {
	case <-e.Server.StopNotify():
		return false
	default:
	}
	return e.Server.Leader() == e.Server.MemberID()
}

// Endpoints returns the client addresses of servers joined by commas, as
// an etcd:// store URL lists them.
func Endpoints(servers []*Server) string {
	eps := make([]string, len(servers))
	for i, s := range servers {
		eps[i] = s.Endpoint()
	}
	return strings.Join(eps, ",")
}

// MoveLeader makes the member after the current leader of servers (in
// their order) lead, as etcd's own leadership transfer does, and returns
// once the transfer is done or failed (at most 10 s). It fails t when no
// member leads or the transfer fails.
func MoveLeader(t testing.TB, servers []*Server) {
	t.Helper()
	for i, s := range servers {
		if !s.IsLeader() {
			continue
		}
		next := servers[(i+1)%len(servers)]
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		from, to := s.member().Server, next.member().Server
		if err := from.MoveLeader(ctx, uint64(from.MemberID()), uint64(to.MemberID())); err != nil {
			t.Fatalf("move the leader from m%d to m%d: %v", i, (i+1)%len(servers), err)
		}
		return
	}
	t.Fatal("no etcd member leads")
}
