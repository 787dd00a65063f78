package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startEtcd starts a one-member etcd in this process on loopback ports with
// its data directory (WAL fsync on, the default) in the temporary
// directory, and returns a client of it.
func (b *bench) startEtcd() (*clientv3.Client, string, error) {
	cport, err := freePort()
	if err != nil {
		return nil, "", err
	}
	pport, err := freePort()
	if err != nil {
		return nil, "", err
	}
	cfg := embed.NewConfig()
	cfg.Name = "bench"
	cfg.Dir = filepath.Join(b.tmp, "etcd")
	curl := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cport)}
	purl := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pport)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{curl}, []url.URL{curl}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{purl}, []url.URL{purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("start etcd: %w", err)
	}
	b.onClose(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return nil, "", fmt.Errorf("etcd not ready after 60s")
	case <-b.ctx.Done():
		return nil, "", b.ctx.Err()
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{curl.Host}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, "", err
	}
	b.onClose(func() { _ = cli.Close() })
	return cli, curl.Host, nil
}

// etcdServer is one etcd the etcd rows run on, with the row ids of its
// rows.
type etcdServer struct {
	label    string // shown in row names: "embedded" or "etcd-server"
	cli      *clientv3.Client
	endpoint string // HOST:PORT
	pid      int    // of its process, 0 when it runs in this one
	ids      etcdIDs
}

// etcdIDs are the row ids of one server's rows.
type etcdIDs struct {
	mutexD, mutexS, put             string // etcd's own client: distinct-key Mutex, shared-key Mutex, one Put
	lease, renew, handle, queue, ns string // leasefs on that server: the cycles of 1a–1d and 1e
	fanout                          string // a lease cycle on one mount with idle mounts beside it
}

var (
	embeddedIDs = etcdIDs{"5d", "5s", "5p", "9a", "9b", "9c", "9d", "9e", "9f"}
	binaryIDs   = etcdIDs{"10d", "10s", "10p", "11a", "11b", "11c", "11d", "11e", "11f"}
)

func (ids etcdIDs) all() []string {
	return []string{ids.mutexD, ids.mutexS, ids.put, ids.lease, ids.renew, ids.handle, ids.queue, ids.ns, ids.fanout}
}

// fanoutMounts are the numbers of idle mounts of the fan-out rows; the
// targets compare the last with the first.
var fanoutMounts = []int{0, 8, 24, 64}

// etcdRows runs the etcd rows on the embedded etcd (5d, 5s, 5p, 9a–9f)
// and, when Debian's etcd-server is installed (the etcd binary), on it
// (10d, 10s, 10p, 11a–11f): etcd's own concurrency.Mutex and a Put beside
// leasefs on the same server in the same run.
func (b *bench) etcdRows() error {
	for _, ids := range []etcdIDs{embeddedIDs, binaryIDs} {
		want := false
		for _, id := range ids.all() {
			want = want || b.want(id, "")
		}
		if !want || b.ctx.Err() != nil {
			continue
		}
		var srv etcdServer
		var err error
		if ids == embeddedIDs {
			b.logf("starting embedded etcd")
			srv.cli, srv.endpoint, err = b.startEtcd()
			srv.label = "embedded"
		} else {
			bin, lerr := exec.LookPath("etcd")
			if lerr != nil {
				b.logf("no etcd binary (Debian's etcd-server): rows %s–%s not run", ids.mutexD, ids.fanout)
				continue
			}
			b.logf("starting %s", bin)
			srv, err = b.startEtcdBinary(bin)
		}
		if err != nil {
			return err
		}
		srv.ids = ids
		if err := b.etcdServerRows(srv); err != nil {
			return err
		}
	}
	return nil
}

// startEtcdBinary starts the etcd binary as a one-member cluster on
// loopback ports with its data in the temporary directory (WAL fsync on,
// the default), and returns a client of it once it answers.
func (b *bench) startEtcdBinary(bin string) (etcdServer, error) {
	cport, err := freePort()
	if err != nil {
		return etcdServer{}, err
	}
	pport, err := freePort()
	if err != nil {
		return etcdServer{}, err
	}
	curl := fmt.Sprintf("http://127.0.0.1:%d", cport)
	purl := fmt.Sprintf("http://127.0.0.1:%d", pport)
	cmd := exec.Command(bin, "--name", "bench", "--data-dir", filepath.Join(b.tmp, "etcd-server"),
		"--listen-client-urls", curl, "--advertise-client-urls", curl,
		"--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
		"--initial-cluster", "bench="+purl, "--log-level", "error")
	c, err := b.spawn("etcd", "", cmd)
	if err != nil {
		return etcdServer{}, err
	}
	host := fmt.Sprintf("127.0.0.1:%d", cport)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{host}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return etcdServer{}, err
	}
	b.onClose(func() { _ = cli.Close() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, time.Second)
		_, err := cli.Get(ctx, "/bench/ping")
		cancel()
		if err == nil {
			break
		}
		select {
		case <-c.exited:
			return etcdServer{}, fmt.Errorf("etcd exited: %s", c.log())
		default:
		}
		if time.Now().After(deadline) || b.ctx.Err() != nil {
			return etcdServer{}, fmt.Errorf("etcd on %s not answering: %v; log:\n%s", host, err, c.log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return etcdServer{label: "etcd-server", cli: cli, endpoint: host, pid: c.cmd.Process.Pid}, nil
}

// etcdServerRows runs one server's rows: Mutex Lock+Unlock on the
// client's own key (against the lease and handle cycles) and on one key
// shared by every client (against the queue), each client with its own
// session (one etcd lease, TTL 60 s); one Put of the client's own key
// (against the renew); then the same daemon as 1a–1e on the etcd store of
// that server, and the fan-out row.
func (b *bench) etcdServerRows(srv etcdServer) error {
	ids, cli := srv.ids, srv.cli
	on := " (" + srv.label + ")"
	mutex := func(shared bool) func(clients, i int) (cycle, func(), error) {
		return func(clients, i int) (cycle, func(), error) {
			sess, err := concurrency.NewSession(cli)
			if err != nil {
				return nil, nil, err
			}
			key := fmt.Sprintf("/bench/distinct/%d/%d", clients, i)
			if shared {
				key = fmt.Sprintf("/bench/shared/%d", clients)
			}
			m := concurrency.NewMutex(sess, key)
			ctx := context.Background()
			return func() error {
					if err := m.Lock(ctx); err != nil {
						return err
					}
					return m.Unlock(ctx)
				}, func() {
					_ = sess.Close()
				}, nil
		}
	}
	if err := b.cellRow(ids.mutexD, nameEtcdD+on, mutex(false)); err != nil {
		return err
	}
	if err := b.cellRow(ids.mutexS, nameEtcdS+on, mutex(true)); err != nil {
		return err
	}
	if err := b.cellRow(ids.put, nameEtcdPut+on, func(clients, i int) (cycle, func(), error) {
		key, val := fmt.Sprintf("/bench/put/%d/%d", clients, i), strings.Repeat("x", 300)
		return func() error {
			_, err := cli.Put(context.Background(), key, val)
			return err
		}, nil, nil
	}); err != nil {
		return err
	}
	leasefsIDs := []string{ids.lease, ids.renew, ids.handle, ids.queue, ids.ns, ids.fanout}
	want := false
	for _, id := range leasefsIDs {
		want = want || b.want(id, "")
	}
	if !want {
		return nil
	}
	store := "etcd://" + srv.endpoint + "/bench-leasefs"
	mp := filepath.Join(b.tmp, "mnt-etcd-"+srv.label)
	d, _, err := b.startLeasefs(filepath.Join(b.tmp, "state-etcd-"+srv.label), mp, "--store", store)
	if err != nil {
		return err
	}
	defer d.stop()
	b.logf("leasefs on the etcd store of %s mounted on %s (pid %d)", srv.label, mp, d.pid)
	if err := b.cycleRows(mp, [4]string{ids.lease, ids.renew, ids.handle, ids.queue},
		[4]string{nameEtcdLease + on, nameEtcdRenew + on, nameEtcdHandle + on, nameEtcdQueue + on}); err != nil {
		return err
	}
	if err := b.cellRow(ids.ns, nameEtcdNS+on, namespacedLeaseCycle(mp)); err != nil {
		return err
	}
	if b.want(ids.lease, "") {
		if err := b.rpcCostTable(srv, mp); err != nil {
			return err
		}
	}
	return b.fanoutRow(srv, store, mp)
}

// fanoutRow runs the fan-out row of srv: a lease cycle of one client on
// mp, the mount of the server's other rows, while N other mounts of the
// same store sit idle (N in fanoutMounts), each its own daemon with its own
// state directory and mountpoint. The note gives the idle daemons' CPU per
// cycle in total and, for an etcd process, its CPU per cycle (utime + stime
// of /proc/PID/stat, proc(5)), and the idle daemons' VmRSS at the end of
// the cell, beside the first idle daemon's right after its mount. A change
// should cost the same however many mounts share the cluster, and an idle
// daemon's memory should not grow with the leases made elsewhere
// (docs/PROTOCOL.md §8a). The idle daemons are stopped and unmounted when
// the row ends, on error too.
func (b *bench) fanoutRow(srv etcdServer, store, mp string) error {
	id := srv.ids.fanout
	if !b.want(id, nameEtcdFanout) {
		return nil
	}
	// idle are the idle daemons; mountRSS[k] is idle[k]'s VmRSS right
	// after it mounted, mountCycles[k] the cycles made before then.
	var (
		idle        []*leasefsDaemon
		mountRSS    []int64
		mountCycles []int64
		cycles      atomic.Int64 // lease cycles begun on mp in this row
	)
	defer func() {
		var wg sync.WaitGroup
		for _, d := range idle {
			wg.Go(d.stop)
		}
		wg.Wait()
	}()
	window := max(b.cfg.duration, 3*time.Second)
	if b.cfg.quick {
		window = b.cfg.duration
	}
	for _, n := range fanoutMounts {
		if len(idle) < n {
			b.logf("%s: starting idle daemons %d to %d", id, len(idle), n-1)
		}
		for len(idle) < n {
			if err := b.ctx.Err(); err != nil {
				return nil
			}
			k := len(idle)
			d, _, err := b.startLeasefs(filepath.Join(b.tmp, fmt.Sprintf("state-idle-%s-%d", srv.label, k)),
				filepath.Join(b.tmp, fmt.Sprintf("mnt-idle-%s-%d", srv.label, k)), "--store", store)
			if err != nil {
				return fmt.Errorf("%s, idle daemon %d of %d: %w", id, k, n, err)
			}
			idle = append(idle, d)
			rss, err := rssBytes(d.pid)
			if err != nil {
				return fmt.Errorf("%s, idle daemon %d: %w", id, k, err)
			}
			mountRSS = append(mountRSS, rss)
			mountCycles = append(mountCycles, cycles.Load())
		}
		time.Sleep(500 * time.Millisecond) // the new daemons' start settles
		pids := make([]int, len(idle))
		for i, d := range idle {
			pids[i] = d.pid
		}
		idle0, etcd0 := cpuOf(pids...), cpuOf(srv.pid)
		saved := b.cfg.duration
		b.cfg.duration = window
		res, err := b.runCell(1, func(i int) (cycle, func(), error) {
			c, _, _ := leaseCycle(mp, fmt.Sprintf("fanout%d", n))(1, i)
			return func() error {
				cycles.Add(1)
				return c()
			}, nil, nil
		})
		b.cfg.duration = saved
		if err != nil {
			return fmt.Errorf("%s, %d idle mounts: %w", id, n, err)
		}
		done := float64(res.n + res.failed)
		if done == 0 {
			return fmt.Errorf("%s, %d idle mounts: no cycle completed", id, n)
		}
		idleMS := float64(cpuOf(pids...)-idle0) / float64(time.Millisecond) / done
		ms := 1000 / res.ops
		note := fmt.Sprintf("%.1f ms per cycle; idle daemons' CPU %.2f ms per cycle in total", ms, idleMS)
		if srv.pid != 0 {
			etcdMS := float64(cpuOf(srv.pid)-etcd0) / float64(time.Millisecond) / done
			note += fmt.Sprintf("; etcd CPU %.2f ms per cycle", etcdMS)
			b.extras[fmt.Sprintf("%s.etcdcpu.%d", id, n)] = etcdMS
		}
		if len(idle) > 0 {
			rss, err := idleRSS(idle, mountRSS, mountCycles, cycles.Load())
			if err != nil {
				return fmt.Errorf("%s, %d idle mounts: %w", id, n, err)
			}
			note += "; " + rss
		}
		if res.failed > 0 {
			note += fmt.Sprintf("; %d failed (%v)", res.failed, res.firstErr)
		}
		b.extras[fmt.Sprintf("%s.ms.%d", id, n)] = ms
		b.extras[fmt.Sprintf("%s.idlecpu.%d", id, n)] = idleMS
		b.extras[fmt.Sprintf("%s.failed.%d", id, n)] = float64(res.failed)
		name := fmt.Sprintf(nameEtcdFanout, n) + " (" + srv.label + ")"
		b.rows = append(b.rows, row{id: id, name: name, clients: 1, ops: res.ops, p50: res.p50, p99: res.p99, note: note})
		b.logf("%-3s %-44s: %9.0f ops/s  p50 %-9s p99 %-9s %s", id, name, res.ops, fmtDur(res.p50), fmtDur(res.p99), note)
	}
	return nil
}

// idleRSS describes the idle daemons' VmRSS now: the sum and the largest,
// the sum right after their mounts (mountRSS), and the first daemon's now
// against right after its mount, with the lease cycles made on the other
// mount in between (cycles now, mountCycles[0] then).
func idleRSS(idle []*leasefsDaemon, mountRSS, mountCycles []int64, cycles int64) (string, error) {
	var sum, top, atMount int64
	rss := make([]int64, len(idle))
	for i, d := range idle {
		r, err := rssBytes(d.pid)
		if err != nil {
			return "", fmt.Errorf("idle daemon %d (pid %d): %w", i, d.pid, err)
		}
		rss[i] = r
		sum += r
		top = max(top, r)
		atMount += mountRSS[i]
	}
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	return fmt.Sprintf("idle daemons' RSS: sum %.0f MiB (%.0f MiB right after their mounts), max %.1f MiB; "+
		"the first idle daemon %.1f MiB right after its mount, %.1f MiB after %d lease cycles elsewhere",
		mib(sum), mib(atMount), mib(top), mib(mountRSS[0]), mib(rss[0]), cycles-mountCycles[0]), nil
}

// cpuOf returns the CPU time (user + system) the processes pids have used
// so far, from /proc/PID/stat (proc(5): utime and stime, fields 14 and 15,
// in clock ticks of 1/100 s); 0 for a pid of 0 or one that is gone.
func cpuOf(pids ...int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		if pid == 0 {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The command name (field 2) may hold spaces: count from its ")".
		rest := string(data)
		if i := strings.LastIndexByte(rest, ')'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		total += time.Duration(u+st) * 10 * time.Millisecond
	}
	return total
}

// etcdTargets are the targets of the etcd store against etcd's own client
// on one server (docs/PROTOCOL.md §8a): ratios of one run.
func (b *bench) etcdTargets(ids etcdIDs, on string) []target {
	f := func(format string, a ...any) string { return fmt.Sprintf(format, a...) + ", " + on }
	ts := []target{
		b.ratio(f("etcd store, lease cycle, 1 client (%s) / Mutex distinct keys (%s)", ids.lease, ids.mutexD), ids.lease, 1, ids.mutexD, 1, 0.5),
		b.ratio(f("etcd store, lease cycle, a namespace per client, 16 clients (%s) / Mutex distinct keys (%s)", ids.ns, ids.mutexD), ids.ns, 16, ids.mutexD, 16, 0.5),
		b.ratio(f("etcd store, renew, 1 client (%s) / one etcd Put (%s)", ids.renew, ids.put), ids.renew, 1, ids.put, 1, 0.7),
		b.ratio(f("etcd store, handle cycle, 1 client (%s) / Mutex distinct keys (%s)", ids.handle, ids.mutexD), ids.handle, 1, ids.mutexD, 1, 0.35),
		b.ratio(f("etcd store, one name, 16 clients queueing (%s) / Mutex one shared key (%s)", ids.queue, ids.mutexS), ids.queue, 16, ids.mutexS, 16, 1.0),
		b.extra(f("etcd store, one name, 16 clients queueing: grants out of turn (%s)", ids.queue), fmt.Sprintf("%s.outofturn.16", ids.queue), 1, "", 0, true),
	}
	last := fanoutMounts[len(fanoutMounts)-1]
	ms := target{what: f("etcd store, ms per lease cycle with %d idle mounts / with none (%s)", last, ids.fanout), goal: 1.3, atMost: true}
	hi, ok1 := b.extras[fmt.Sprintf("%s.ms.%d", ids.fanout, last)]
	lo, ok2 := b.extras[fmt.Sprintf("%s.ms.0", ids.fanout)]
	if ok1 && ok2 && lo > 0 {
		ms.value = hi / lo
	} else {
		ms.missing = "row " + ids.fanout
	}
	ts = append(ts, ms)
	if e0, ok := b.extras[fmt.Sprintf("%s.etcdcpu.0", ids.fanout)]; ok && e0 > 0 {
		ts = append(ts, target{what: f("etcd store, etcd CPU per lease cycle with %d idle mounts / with none (%s)", last, ids.fanout),
			goal: 1.3, atMost: true, value: b.extras[fmt.Sprintf("%s.etcdcpu.%d", ids.fanout, last)] / e0})
	}
	ts = append(ts, b.extra(f("etcd store, idle daemons' CPU per lease cycle with %d idle mounts (%s)", last, ids.fanout),
		fmt.Sprintf("%s.idlecpu.%d", ids.fanout, last), 1, " ms", 2, true))
	ts = append(ts, b.rpcTargets(ids.lease, on)...)
	failed, seen := 0.0, false
	for key, v := range b.extras {
		id, _, ok := strings.Cut(key, ".failed.")
		if ok && slices.Contains(ids.all(), id) {
			failed += v
			seen = true
		}
	}
	ft := target{what: f("etcd store and etcd's client, failed calls in any row (%s–%s)", ids.mutexD, ids.fanout), goal: 0, atMost: true, value: failed}
	if !seen {
		ft.missing = "no row of " + on
	}
	return append(ts, ft)
}
