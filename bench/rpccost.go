package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.etcd.io/etcd/client/v3/concurrency"
	"golang.org/x/sys/unix"
)

// rpcCost is what one operation cost an etcd server, from its own
// counters: raft proposals committed (etcd_server_proposals_committed_total),
// unary calls by method (grpc_server_handled_total{grpc_type="unary"}) and
// keep-alive messages received (grpc_server_msg_received_total of
// LeaseKeepAlive), averaged over a number of operations made one after
// another.
type rpcCost struct {
	workload  string
	budget    string // key of its rpcBudgets entry; "" for etcd's own client
	ns        bool   // made on names in a namespace, not at the mount's root
	writes    float64
	unary     map[string]float64
	keepAlive float64
}

// rpcBudget is the most a workload may cost the etcd server, at the
// mount's root and in a namespace alike: raft writes and unary calls per
// operation.
type rpcBudget struct {
	key, what     string
	writes, calls float64
}

// rpcBudgets are the budgets of the leasefs workloads of the cost table,
// per operation run back to back: docs/PROTOCOL.md §8a's table, which
// etcdstore's TestSystemCallCost asserts.
var rpcBudgets = []rpcBudget{
	{"lease", "lease cycle", 2, 4},
	{"renew", "renew", 1, 1},
	{"handle", "handle cycle", 3, 5},
	{"stat", "stat", 0, 1},
	{"cat", "cat", 0, 1},
}

// rpcSlack is how far above its budget a measured average may be and
// still pass: background work in the window (a bucket granted ahead of
// need, history pruning) is spread over the operations.
const rpcSlack = 0.05

// budgetOf returns the budget with key.
func budgetOf(key string) (rpcBudget, bool) {
	i := slices.IndexFunc(rpcBudgets, func(bu rpcBudget) bool { return bu.key == key })
	if i < 0 {
		return rpcBudget{}, false
	}
	return rpcBudgets[i], true
}

func (c rpcCost) calls() float64 {
	n := 0.0
	for _, v := range c.unary {
		n += v
	}
	return n
}

// rpcTable is the cost table of one server.
type rpcTable struct {
	server string
	costs  []rpcCost
}

// serverCounters is a snapshot of the counters rpcCost reads.
type serverCounters struct {
	proposals float64
	unary     map[string]float64
	keepAlive float64
}

// scrape reads the counters from http://endpoint/metrics, which etcd
// serves on its client URL.
func scrape(ctx context.Context, endpoint string) (serverCounters, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+"/metrics", nil)
	if err != nil {
		return serverCounters{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return serverCounters{}, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return serverCounters{}, fmt.Errorf("parse %s/metrics: %w", endpoint, err)
	}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	c := serverCounters{unary: map[string]float64{}}
	if mf := mfs["etcd_server_proposals_committed_total"]; mf != nil {
		for _, m := range mf.GetMetric() {
			c.proposals += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	if mf := mfs["grpc_server_handled_total"]; mf != nil {
		for _, m := range mf.GetMetric() {
			if label(m, "grpc_type") == "unary" {
				c.unary[label(m, "grpc_method")] += m.GetCounter().GetValue()
			}
		}
	}
	if mf := mfs["grpc_server_msg_received_total"]; mf != nil {
		for _, m := range mf.GetMetric() {
			if label(m, "grpc_method") == "LeaseKeepAlive" {
				c.keepAlive += m.GetCounter().GetValue()
			}
		}
	}
	return c, nil
}

// rpcNamespace is the namespace the cost table's second set of leasefs
// workloads runs in.
const rpcNamespace = "rpc-ns"

// rpcWorkload is one operation of the cost table.
type rpcWorkload struct {
	name   string
	budget string // key in rpcBudgets; "" for none
	ns     bool
	op     func() error
}

// rpcCostTable measures, on srv, what each system call of a lease's life
// costs the server through the mount mp, on names at the mount's root and
// then in the namespace rpcNamespace, beside etcd's own Mutex and Put:
// each workload runs n times one after another between two scrapes of the
// server's counters. Background work that falls in the window (the
// daemon's keep-alives, a bucket granted ahead of need) is counted in it,
// spread over the n operations. The costs go to b.rpcTables and, for the
// budgets, to b.extras under the row id of srv's lease cycle.
func (b *bench) rpcCostTable(srv etcdServer, mp string) error {
	n := 200
	if b.cfg.quick {
		n = 10
	}
	nsDir := filepath.Join(mp, rpcNamespace)
	if err := os.Mkdir(nsDir, 0o755); err != nil {
		return fmt.Errorf("rpc cost: mkdir %s: %w", nsDir, err)
	}
	defer os.Remove(nsDir)
	root, err := leasefsRPCWorkloads(mp, "", false)
	if err != nil {
		return err
	}
	defer root.close()
	inNS, err := leasefsRPCWorkloads(nsDir, " in a namespace, "+rpcNamespace+"/NAME", true)
	if err != nil {
		return err
	}
	defer inNS.close()
	sess, err := concurrency.NewSession(srv.cli)
	if err != nil {
		return err
	}
	defer sess.Close()
	mutex := concurrency.NewMutex(sess, "/bench/rpc-mutex")
	ctx := context.Background()
	workloads := slices.Concat(root.workloads, inNS.workloads, []rpcWorkload{
		{name: "etcd's concurrency.Mutex: Lock + Unlock", op: func() error {
			if err := mutex.Lock(ctx); err != nil {
				return err
			}
			return mutex.Unlock(ctx)
		}},
		{name: "etcd's client: one Put", op: func() error {
			_, err := srv.cli.Put(ctx, "/bench/rpc-put", "x")
			return err
		}},
	})
	table := rpcTable{server: srv.label}
	for _, w := range workloads {
		time.Sleep(200 * time.Millisecond) // the previous workload's follow-ups settle
		before, err := scrape(b.ctx, srv.endpoint)
		if err != nil {
			return err
		}
		for range n {
			if err := w.op(); err != nil {
				return fmt.Errorf("rpc cost, %s: %w", w.name, err)
			}
		}
		time.Sleep(200 * time.Millisecond)
		after, err := scrape(b.ctx, srv.endpoint)
		if err != nil {
			return err
		}
		c := rpcCost{workload: w.name, budget: w.budget, ns: w.ns, unary: map[string]float64{},
			writes:    (after.proposals - before.proposals) / float64(n),
			keepAlive: (after.keepAlive - before.keepAlive) / float64(n)}
		for m, v := range after.unary {
			if d := v - before.unary[m]; d > 0 {
				c.unary[m] = d / float64(n)
			}
		}
		if c.budget != "" {
			b.extras[rpcExtra(srv.ids.lease, c.budget, c.ns, "writes")] = c.writes
			b.extras[rpcExtra(srv.ids.lease, c.budget, c.ns, "calls")] = c.calls()
		}
		table.costs = append(table.costs, c)
		b.logf("rpc cost on %s, %s: %s", srv.label, w.name, c)
	}
	b.rpcTables = append(b.rpcTables, table)
	return nil
}

// rpcExtra is the key in bench.extras of one measured cost: what is
// "writes" or "calls".
func rpcExtra(leaseID, budget string, ns bool, what string) string {
	depth := "root"
	if ns {
		depth = "ns"
	}
	return fmt.Sprintf("%s.rpc.%s.%s.%s", leaseID, budget, depth, what)
}

// rpcLeaseWorkloads are the leasefs workloads of the cost table on names
// in one directory, with the lease they renew, stat and read.
type rpcLeaseWorkloads struct {
	workloads []rpcWorkload
	close     func() // ends the held lease
}

// leasefsRPCWorkloads reserves the lease rpc-held in dir, reads its token
// and returns the workloads on names in dir (the lease cycle, the renew,
// the handle cycle, stat and cat), each name followed by suffix.
func leasefsRPCWorkloads(dir, suffix string, ns bool) (rpcLeaseWorkloads, error) {
	p := func(name string) string { return filepath.Join(dir, name) }
	readAll := func(fd int) error {
		buf := make([]byte, 4096)
		for {
			k, err := unix.Read(fd, buf)
			if err != nil || k == 0 {
				return err
			}
		}
	}
	held, err := unix.Open(p("rpc-held"), unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return rpcLeaseWorkloads{}, fmt.Errorf("reserve %s: %w", p("rpc-held"), err)
	}
	end := func() { unix.Close(held); _ = os.Remove(p("rpc-held")) }
	tok := make([]byte, 256)
	k, err := unix.Read(held, tok)
	if err != nil {
		end()
		return rpcLeaseWorkloads{}, fmt.Errorf("read the token of %s: %w", p("rpc-held"), err)
	}
	token := []byte(strings.TrimSpace(string(tok[:k])) + "\n")
	label := func(what, how string) string {
		if how == "" {
			return what + suffix
		}
		return what + suffix + " (" + how + ")"
	}
	ws := []rpcWorkload{
		{label("lease cycle", "create, read token, close, unlink"), "lease", ns, func() error {
			fd, err := unix.Open(p("rpc-cycle"), unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return err
			}
			err = readAll(fd)
			unix.Close(fd)
			if err != nil {
				return err
			}
			return unix.Unlink(p("rpc-cycle"))
		}},
		{label("renew", "write the token"), "renew", ns, func() error {
			_, err := unix.Pwrite(held, token, 0)
			return err
		}},
		{label("handle cycle", "open O_CREAT, flock, unlock, close"), "handle", ns, func() error {
			fd, err := unix.Open(p("rpc-handle"), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
				return err
			}
			return unix.Flock(fd, unix.LOCK_UN)
		}},
		{label("stat of a lease", ""), "stat", ns, func() error {
			var st unix.Stat_t
			return unix.Stat(p("rpc-held"), &st)
		}},
		{label("cat of a lease", "open, reads, close"), "cat", ns, func() error {
			fd, err := unix.Open(p("rpc-held"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return readAll(fd)
		}},
	}
	return rpcLeaseWorkloads{workloads: ws, close: end}, nil
}

func (c rpcCost) String() string {
	return fmt.Sprintf("%.2f writes, %.2f unary calls (%s), %.2f keep-alive messages", c.writes, c.calls(), c.methods(), c.keepAlive)
}

// methods lists the unary calls by method, most first.
func (c rpcCost) methods() string {
	ms := make([]string, 0, len(c.unary))
	for m := range c.unary {
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b string) int {
		if c.unary[a] != c.unary[b] {
			if c.unary[a] > c.unary[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	for i, m := range ms {
		ms[i] = fmt.Sprintf("%s %.2f", m, c.unary[m])
	}
	return strings.Join(ms, ", ")
}

// writeMarkdown writes t as a section of BENCHMARKS.md.
func (t rpcTable) writeMarkdown(b *bytes.Buffer) {
	fmt.Fprintf(b, "\n## What each system call costs the etcd server (%s)\n\n", t.server)
	b.WriteString("Read from the server's own counters (`/metrics`: `etcd_server_proposals_committed_total`, " +
		"`grpc_server_handled_total` of unary calls, `grpc_server_msg_received_total` of `LeaseKeepAlive`) around " +
		"each workload, run one operation after another through one mount and divided by their number; " +
		"background work in the window is spread over it. The budget test " +
		"(`go test -run TestSystemCallCost -v ./etcdstore/`) counts the same per operation.\n\n")
	b.WriteString("Each leasefs workload runs on names at the mount's root and then on names in a namespace (`" + rpcNamespace + "/NAME`); " +
		"its budget, writes / unary calls per operation, is the same at any depth, and an average within " +
		fmt.Sprint(rpcSlack) + " of it is within budget (the background work).\n\n")
	b.WriteString("| workload | writes (raft proposals) | unary calls | budget: writes / calls | by method | keep-alive messages |\n" +
		"| --- | ---: | ---: | ---: | --- | ---: |\n")
	for _, c := range t.costs {
		budget := "-"
		if bu, ok := budgetOf(c.budget); ok {
			budget = fmt.Sprintf("≤ %g / ≤ %g", bu.writes, bu.calls)
		}
		fmt.Fprintf(b, "| %s | %.2f | %.2f | %s | %s | %.2f |\n", c.workload, c.writes, c.calls(), budget, c.methods(), c.keepAlive)
	}
}

// rpcTargets are the budgets of the cost table of the server whose lease
// cycle is row leaseID: for each workload and each of writes and unary
// calls, the larger of its cost at the mount's root and in a namespace.
func (b *bench) rpcTargets(leaseID, on string) []target {
	var ts []target
	for _, bu := range rpcBudgets {
		for _, m := range []struct {
			what string
			goal float64
		}{{"raft writes", bu.writes}, {"unary calls", bu.calls}} {
			key := "writes"
			if m.what == "unary calls" {
				key = "calls"
			}
			t := target{what: fmt.Sprintf("etcd store, %s at the root and in a namespace (%s/NAME), the larger: %s per operation, %s",
				bu.what, rpcNamespace, m.what, on), goal: m.goal, atMost: true, slack: rpcSlack}
			root, ok1 := b.extras[rpcExtra(leaseID, bu.key, false, key)]
			ns, ok2 := b.extras[rpcExtra(leaseID, bu.key, true, key)]
			if ok1 && ok2 {
				t.value = max(root, ns)
			} else {
				t.missing = "the cost table of " + on + " (row " + leaseID + ")"
			}
			ts = append(ts, t)
		}
	}
	return ts
}
