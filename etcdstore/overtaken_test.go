package etcdstore

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/leasefs/leasefs/etcdstore/etcdtest"
	"github.com/leasefs/leasefs/leasecore"
)

// heldReads holds the answer of the next read-only transaction while
// armed, until released: a call whose answer is processed after the
// watch has shown later changes, as a loaded daemon's scheduler can
// arrange. Safe for concurrent use.
type heldReads struct {
	armed   atomic.Bool
	held    chan struct{} // closed when an answer is held
	release chan struct{} // closed to let it go
}

func (h *heldReads) dialOption() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if tx, ok := req.(*pb.TxnRequest); ok && strings.HasSuffix(method, "/Txn") && len(tx.Compare) == 0 && h.armed.CompareAndSwap(true, false) {
			close(h.held)
			<-h.release
		}
		return err
	})
}

// TestAnswerOvertakenByTheWatch: a read that found lease A live, whose
// answer is processed only after the watch has shown A's end, must not
// bring A back into the store's view, where it would stand in the way
// of every later waiter of the name for as long as the daemon runs
// (docs/ARCHITECTURE.md, "The etcd store").
func TestAnswerOvertakenByTheWatch(t *testing.T) {
	srv := etcdtest.Start(t)
	h := &heldReads{held: make(chan struct{}), release: make(chan struct{})}
	s, err := Open(context.Background(), []string{srv.Endpoint()}, "/overtaken", Options{
		Options:     leasecore.Options{LeaseDuration: time.Hour},
		DialOptions: []grpc.DialOption{h.dialOption()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	ended := s.Watch(ctx, leasecore.EventEnded)
	a, err := s.Reserve(ctx, leasecore.Draft{Resource: "x"})
	if err != nil {
		t.Fatal(err)
	}

	h.armed.Store(true)
	read := make(chan error, 1)
	go func() {
		// Answered after the watch showed the end: the name is free.
		_, l, err := s.ReadName(ctx, "x")
		if err == nil && l != nil {
			t.Errorf("ReadName answered %+v, whose end the watch had shown before the answer was processed; want the name free", l)
		}
		read <- err
	}()
	<-h.held
	if _, err := s.End(ctx, a.Lease.ID, leasecore.StatusComplete); err != nil {
		t.Fatal(err)
	}
	for e := range ended {
		if e.Lease.ID == a.Lease.ID {
			break
		}
	}
	close(h.release)
	if err := <-read; err != nil {
		t.Fatal(err)
	}

	if l, live, _ := s.Known("x"); live {
		t.Errorf("the store's view holds ended lease %s again: %+v", a.Lease.ID, l)
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := s.Acquire(actx, leasecore.Draft{Resource: "x"}); err != nil {
		t.Fatalf("a waiter of the free name: %v", err)
	}
}

// TestWaiterAnswerOvertakenByTheWatch: the head of a name's queue, as a
// call read it, learned only after the watch has shown that waiter key
// deleted, must not enter the store's view of the queue, where it would
// stand ahead of every later waiter of the name for as long as the daemon
// runs (docs/ARCHITECTURE.md, "The etcd store"). The answer is the
// one [Store.isHead] and a reservation refused as not the head learn from.
func TestWaiterAnswerOvertakenByTheWatch(t *testing.T) {
	srv := etcdtest.Start(t)
	s, err := Open(context.Background(), []string{srv.Endpoint()}, "/overtaken", Options{
		Options: leasecore.Options{LeaseDuration: time.Hour},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	key := s.k.waiters("x") + leasecore.NewLeaseID()
	// The store follows x from now, as a daemon does a name its kernel
	// knows.
	now, err := s.cli.Get(ctx, s.k.live("x"))
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.observe("x", now.Header.Revision, nil, nil)
	s.mu.Unlock()
	put, err := s.cli.Put(ctx, key, "0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.cli.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.mu.Lock()
		_, queued := s.queue["x"][key]
		watched := s.follows["x"].waitSeen
		s.mu.Unlock()
		if !queued && watched > put.Header.Revision {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watch did not show waiter key %s put and deleted in 30 s", key)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.mu.Lock()
	s.learnWaiter("x", key, put.Header.Revision, put.Header.Revision)
	_, queued := s.queue["x"][key]
	s.mu.Unlock()
	if queued {
		t.Errorf("the store's view of the queue holds deleted waiter key %s again", key)
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := s.Acquire(actx, leasecore.Draft{Resource: "x"}); err != nil {
		t.Fatalf("a waiter of the free name: %v", err)
	}
}
