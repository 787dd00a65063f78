package etcdtest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy forwards TCP connections from a loopback port to a server, and can
// cut them all at once: to its clients the cluster is then gone, as when
// the server's machine dies or the network partitions (connections reset,
// new ones refused). Safe for concurrent use.
type Proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  []net.Conn
	wg     sync.WaitGroup
	// dropReplies: bytes from the server are read and discarded.
	dropReplies atomic.Bool
}

// NewProxy starts a proxy to target ("HOST:PORT") on a free port of
// 127.0.0.1 and arranges for it to be cut when t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("etcdtest: proxy listen: %v", err)
	}
	p := &Proxy{l: l, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(p.Cut)
	return p
}

// Endpoint returns the proxy's address, "127.0.0.1:PORT".
func (p *Proxy) Endpoint() string { return p.l.Addr().String() }

// Resume listens again on the same address after [Proxy.Cut]: the cluster
// is back. It fails t when the port was taken meanwhile.
func (p *Proxy) Resume(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		return
	}
	l, err := net.Listen("tcp", p.l.Addr().String())
	if err != nil {
		t.Fatalf("etcdtest: proxy listen again: %v", err)
	}
	p.l, p.cut, p.conns = l, false, nil
	p.wg.Go(p.accept)
}

// DropReplies makes the proxy, while on is true, forward what clients send
// and discard what the server answers: a request reaches the cluster and
// commits, and its client never learns it (the answer lost as in a leader
// election), so its outcome is unknown to the client.
func (p *Proxy) DropReplies(on bool) { p.dropReplies.Store(on) }

// Cut closes the listener and every forwarded connection and waits for the
// forwarding goroutines; a second call is a no-op.
func (p *Proxy) Cut() {
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		return
	}
	p.cut = true
	p.l.Close()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	p.mu.Lock()
	l := p.l
	p.mu.Unlock()
	for {
		in, err := l.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			in.Close()
			out.Close()
			return
		}
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		pipe := func(dst net.Conn, w io.Writer, src net.Conn) {
			_, _ = io.Copy(w, src)
			dst.Close()
			src.Close()
		}
		p.wg.Go(func() { pipe(in, &replies{w: in, p: p}, out) })
		p.wg.Go(func() { pipe(out, out, in) })
	}
}

// replies writes the server's bytes to the client unless the proxy drops
// them.
type replies struct {
	w io.Writer
	p *Proxy
}

func (r *replies) Write(b []byte) (int, error) {
	if r.p.dropReplies.Load() {
		return len(b), nil
	}
	return r.w.Write(b)
}
