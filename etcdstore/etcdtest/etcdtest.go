// Package etcdtest starts an embedded single-member etcd server on loopback
// ports for the tests of the etcd store and of daemons that use it
// (docs/PROTOCOL.md §8a). Nothing here is for production use.
package etcdtest

import (
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// Server is one embedded etcd member. Its methods are safe for concurrent
// use.
type Server struct {
	mu       sync.Mutex
	etcd     *embed.Etcd // the running member; nil once stopped
	last     *embed.Etcd // the member last started
	cfg      *embed.Config
	endpoint string
}

// Start starts an etcd member with its data in a temporary directory of t,
// listening on free ports of 127.0.0.1, waits until it serves (at most
// 30 s) and arranges for it to be stopped when t ends. It fails t when the
// server cannot start.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, nil)
}

func start(t testing.TB, tlsFiles *TLSFiles) *Server {
	t.Helper()
	s, err := launch(t.TempDir(), tlsFiles)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartShared starts an etcd member like [Start] with its data in dir, for
// a server that outlives single tests (one per test binary, started from
// TestMain); the caller must call Stop. Errors: the server could not start
// or did not serve within 30 s.
func StartShared(dir string) (*Server, error) {
	return launch(dir, nil)
}

// launch starts a member with its data in dir and waits until it serves.
func launch(dir string, tlsFiles *TLSFiles) (*Server, error) {
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Logger = "zap"
	cfg.LogLevel = "fatal" // a stopped server logs its closed listeners as errors
	cfg.LogOutputs = []string{"stderr"}
	// Port 0: the kernel picks free ports as the listeners open, so that
	// parallel tests cannot collide. A single member never dials its peer
	// URL, and clients are given the client listener's real address.
	client, peer := url.URL{Scheme: "http", Host: "127.0.0.1:0"}, url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	if tlsFiles != nil {
		client.Scheme = "https"
		cfg.ClientTLSInfo = transport.TLSInfo{
			CertFile: tlsFiles.serverCert, KeyFile: tlsFiles.serverKey,
			TrustedCAFile: tlsFiles.CA, ClientCertAuth: true,
		}
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	// Short election timings: a single member elects itself at once.
	cfg.TickMs, cfg.ElectionMs = 10, 100
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, errors.New("etcd did not become ready within 30s")
	}
	return &Server{etcd: e, last: e, cfg: cfg, endpoint: e.Clients[0].Addr().String()}, nil
}

// Endpoint returns the client address, "127.0.0.1:PORT".
func (s *Server) Endpoint() string { return s.endpoint }

// Stop stops the server; a second call is a no-op. Clients then see the
// cluster unreachable. A leader of a cluster hands its leadership over
// first, as etcd does on SIGTERM.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd != nil {
		s.etcd.Close()
		s.etcd = nil
	}
}

// Kill stops the member as a crash (SIGKILL) would for the rest of its
// cluster: its raft node stops at once, with no leadership transfer, so
// that the others elect a leader only after their election timeout; then
// its listeners close. A second call, or one after Stop, is a no-op.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd != nil {
		s.etcd.Server.HardStop()
		s.etcd.Close()
		s.etcd = nil
	}
}

// Restart starts a stopped or killed member again on its data directory
// and addresses, and waits until it serves (at most 30 s). It fails t when
// it cannot start; it is a no-op while the member runs.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.etcd != nil {
		return
	}
	e, err := embed.StartEtcd(s.cfg)
	if err != nil {
		t.Fatalf("etcdtest: restart member %s: %v", s.cfg.Name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		t.Fatalf("etcdtest: member %s did not serve within 30s of its restart", s.cfg.Name)
	}
	s.etcd, s.last = e, e
}

// member returns the member last started (running or stopped).
func (s *Server) member() *embed.Etcd {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// CommittedIndex returns the member's raft commit index: with nothing else
// writing, the number of proposals (writes, lease grants and revokes) the
// cluster has committed so far, so that a test can count what one
// operation cost it.
func (s *Server) CommittedIndex() uint64 { return s.member().Server.CommittedIndex() }

// LeasesExpired returns how many etcd leases the members of this process
// have revoked because their TTL ran out, from etcd's own counter
// etcd_debugging_server_lease_expired_total: each revocation is a raft
// proposal no client made, which a test of what a client costs names as
// the server's background work. The counter is shared by every member
// started in the process; 0 when it cannot be read.
func (s *Server) LeasesExpired() uint64 {
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() == "etcd_debugging_server_lease_expired_total" && len(mf.GetMetric()) > 0 {
			return uint64(mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
	return 0
}
