package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// leaseCycle is row 1a on the mount mp: open(O_CREAT|O_EXCL|O_RDWR) of the
// client's own name, read the token, close, unlink (docs/PROTOCOL.md §3).
func leaseCycle(mp, prefix string) func(clients, i int) (cycle, func(), error) {
	return func(clients, i int) (cycle, func(), error) {
		return leaseCycleAt(filepath.Join(mp, fmt.Sprintf("%s%d-%d", prefix, clients, i))), nil, nil
	}
}

// leaseCycleAt is one lease cycle on the name p: create it exclusively,
// read the token, close, unlink.
func leaseCycleAt(p string) cycle {
	buf := make([]byte, 256)
	return func() error {
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
		if err != nil {
			if errors.Is(err, unix.EEXIST) {
				_ = unix.Unlink(p)
			}
			return fmt.Errorf("open: %w", err)
		}
		n, err := unix.Read(fd, buf)
		_ = unix.Close(fd)
		if err != nil {
			_ = unix.Unlink(p)
			return fmt.Errorf("read: %w", err)
		}
		if n == 0 {
			_ = unix.Unlink(p)
			return errors.New("read: empty token")
		}
		if err := unix.Unlink(p); err != nil {
			return fmt.Errorf("unlink: %w", err)
		}
		return nil
	}
}

// namespacedLeaseCycle is row 1e: the lease cycle of 1a, each client in a
// namespace (directory, docs/PROTOCOL.md §3) of its own, made in setup and
// removed after the cell. The kernel holds a directory's inode lock across
// every create and unlink in it, and so across the commit the daemon makes
// before answering; clients in different directories do not wait for it.
func namespacedLeaseCycle(mp string) func(clients, i int) (cycle, func(), error) {
	return func(clients, i int) (cycle, func(), error) {
		dir := filepath.Join(mp, fmt.Sprintf("ns%d-%d", clients, i))
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, nil, fmt.Errorf("mkdir %s: %w", dir, err)
		}
		return leaseCycleAt(filepath.Join(dir, "lease")), func() { _ = os.Remove(dir) }, nil
	}
}

// renewCycle is row 1b: the client reserves its own name once, reads the
// token and then renews by writing it at offset 0 (docs/PROTOCOL.md §4.2,
// a bare token).
func renewCycle(mp string) func(clients, i int) (cycle, func(), error) {
	return func(clients, i int) (cycle, func(), error) {
		p := filepath.Join(mp, fmt.Sprintf("renew%d-%d", clients, i))
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return nil, nil, fmt.Errorf("reserve %s: %w", p, err)
		}
		buf := make([]byte, 256)
		n, err := unix.Read(fd, buf)
		if err != nil || n == 0 {
			_ = unix.Close(fd)
			return nil, nil, fmt.Errorf("read token of %s: %d bytes, %v", p, n, err)
		}
		tok := append(bytes.TrimSpace(buf[:n]), '\n')
		teardown := func() {
			_ = unix.Unlink(p)
			_ = unix.Close(fd)
		}
		return func() error {
			if _, err := unix.Pwrite(fd, tok, 0); err != nil {
				return fmt.Errorf("pwrite: %w", err)
			}
			return nil
		}, teardown, nil
	}
}

// handleCycle is row 1c: open(O_CREAT|O_RDWR) of a free name reserves it,
// flock(LOCK_EX|LOCK_NB) binds it as a handle lease, LOCK_UN ends it, then
// close (docs/PROTOCOL.md §6).
func handleCycle(mp, prefix string) func(clients, i int) (cycle, func(), error) {
	return func(clients, i int) (cycle, func(), error) {
		p := filepath.Join(mp, fmt.Sprintf("%s%d-%d", prefix, clients, i))
		return func() error {
			fd, err := unix.Open(p, unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return fmt.Errorf("open: %w", err)
			}
			defer unix.Close(fd)
			if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
				return fmt.Errorf("flock LOCK_EX|LOCK_NB: %w", err)
			}
			if err := unix.Flock(fd, unix.LOCK_UN); err != nil {
				return fmt.Errorf("flock LOCK_UN: %w", err)
			}
			return nil
		}, nil, nil
	}
}

// grantLog collects the wait and hold of every blocking lock of row 1d.
// Safe for concurrent use.
type grantLog struct {
	mu   sync.Mutex
	recs []grantRec
}

// grantRec is one blocking lock as its client saw it: asked is taken just
// before the flock call, granted just after it returned.
type grantRec struct {
	asked, granted time.Time
	hold           time.Duration
}

func (g *grantLog) add(r grantRec) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.recs = append(g.recs, r)
}

// outOfTurnTolerance is how much earlier another client's wait must have
// begun for a grant to count as out of turn: a client takes its time just
// before flock, and its request reaches the daemon a little later (on this
// 2-core machine, with 16 clients and the daemon sharing it, up to a few
// milliseconds: the file store, strictly first come first served, showed
// passes of waits begun 1–2 ms earlier), so two waits begun less than this
// apart cannot be ordered from the clients' clocks.
const outOfTurnTolerance = 5 * time.Millisecond

// queueStats summarises a grantLog over a measured window.
type queueStats struct {
	p99Wait, meanWait, meanHold time.Duration
	grants                      int // grants whose wait began in the window
	// outOfTurn counts the grants made while another client, whose wait
	// began at least outOfTurnTolerance earlier, was still waiting;
	// outOfTurnAny counts them with no tolerance.
	outOfTurn, outOfTurnAny int
	// maxLead is, over the grants out of turn, the longest time by which
	// a wait they passed had begun before theirs.
	maxLead time.Duration
}

// summary returns the stats of the grants whose wait began at or after
// from. Every recorded wait, also one begun before from, counts as a wait
// that a grant may have passed.
func (g *grantLog) summary(from time.Time) queueStats {
	g.mu.Lock()
	all := slices.Clone(g.recs)
	g.mu.Unlock()
	recs := slices.DeleteFunc(slices.Clone(all), func(r grantRec) bool { return r.asked.Before(from) })
	if len(recs) == 0 {
		return queueStats{}
	}
	waits := make([]time.Duration, len(recs))
	var wait, hold time.Duration
	for i, r := range recs {
		waits[i] = r.granted.Sub(r.asked)
		wait += waits[i]
		hold += r.hold
	}
	n := time.Duration(len(recs))
	st := queueStats{p99Wait: quantile(waits, 0.99), meanWait: wait / n, meanHold: hold / n, grants: len(recs)}
	st.outOfTurn, st.maxLead = outOfTurn(all, recs, outOfTurnTolerance)
	st.outOfTurnAny, _ = outOfTurn(all, recs, 0)
	return st
}

// outOfTurn counts the grants of recs that went out of turn among the
// waits of all: a grant G is out of turn when some wait W began at least
// tol before G's (W.asked <= G.asked - tol) and was not yet granted when G
// was (W.granted after G.granted). A client takes its grant time before it
// unlocks, so a W granted before G always has the earlier grant time.
// maxLead is the longest time by which a passed wait began before the
// grant's own.
func outOfTurn(all, recs []grantRec, tol time.Duration) (n int, maxLead time.Duration) {
	byAsk := slices.Clone(all)
	slices.SortFunc(byAsk, func(a, b grantRec) int { return a.asked.Compare(b.asked) })
	// lastGrant[i] is the latest grant among the waits byAsk[:i+1].
	lastGrant := make([]time.Time, len(byAsk))
	for i, r := range byAsk {
		lastGrant[i] = r.granted
		if i > 0 && lastGrant[i-1].After(r.granted) {
			lastGrant[i] = lastGrant[i-1]
		}
	}
	for _, g := range recs {
		cut := g.asked.Add(-tol)
		// j waits began at or before cut; G itself is not among them
		// when tol > 0, and cannot be granted after itself when tol is 0.
		j, _ := slices.BinarySearchFunc(byAsk, cut, func(r grantRec, t time.Time) int {
			if r.asked.After(t) {
				return 1
			}
			return -1
		})
		if j == 0 || !lastGrant[j-1].After(g.granted) {
			continue
		}
		n++
		// The earliest wait passed is the first, in order of asking,
		// still waiting at g's grant.
		for _, w := range byAsk[:j] {
			if w.granted.After(g.granted) {
				maxLead = max(maxLead, g.asked.Sub(w.asked))
				break
			}
		}
	}
	return n, maxLead
}

// queueCycle is row 1d: every client opens the SAME name, blocks in
// flock(LOCK_EX), unlocks and closes; g records wait and hold.
func queueCycle(p string, g *grantLog) func(i int) (cycle, func(), error) {
	return func(i int) (cycle, func(), error) {
		return func() error {
			fd, err := unix.Open(p, unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return fmt.Errorf("open: %w", err)
			}
			defer unix.Close(fd)
			asked := time.Now()
			if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
				return fmt.Errorf("flock LOCK_EX: %w", err)
			}
			granted := time.Now()
			err = unix.Flock(fd, unix.LOCK_UN)
			g.add(grantRec{asked: asked, granted: granted, hold: time.Since(granted)})
			if err != nil {
				return fmt.Errorf("flock LOCK_UN: %w", err)
			}
			return nil
		}, nil, nil
	}
}

// queueRow runs row 1d (one shared name, N clients queueing) on mp.
func (b *bench) queueRow(id, name, mp string) error {
	if !b.want(id, name) {
		return nil
	}
	for _, n := range b.cfg.clients {
		if b.ctx.Err() != nil {
			return nil
		}
		g := &grantLog{}
		started := time.Now()
		res, err := b.runCell(n, queueCycle(filepath.Join(mp, fmt.Sprintf("queue%d", n)), g))
		if err != nil {
			return fmt.Errorf("%s, %d clients: %w", id, n, err)
		}
		st := g.summary(started.Add(b.cfg.warmup))
		ratio, meanRatio := 0.0, 0.0
		if st.meanHold > 0 {
			ratio = float64(st.p99Wait) / float64(st.meanHold)
			meanRatio = float64(st.meanWait) / float64(st.meanHold)
		}
		pct := func(k int) float64 {
			if st.grants == 0 {
				return 0
			}
			return 100 * float64(k) / float64(st.grants)
		}
		note := fmt.Sprintf("failed %d; p99 wait %s / mean hold %s = %.1f (mean wait %.1f holds); "+
			"grants out of turn %d of %d (%.1f%%), passing a wait begun ≥ %s earlier (%.1f%% with no tolerance)",
			res.failed, fmtDur(st.p99Wait), fmtDur(st.meanHold), ratio, meanRatio,
			st.outOfTurn, st.grants, pct(st.outOfTurn), fmtDur(outOfTurnTolerance), pct(st.outOfTurnAny))
		if st.outOfTurn > 0 {
			note += fmt.Sprintf("; the passed waits had begun up to %s earlier", fmtDur(st.maxLead))
		}
		if res.failed > 0 {
			note += fmt.Sprintf(" (first: %v)", res.firstErr)
		}
		b.rows = append(b.rows, row{id: id, name: name, clients: n, ops: res.ops, p50: res.p50, p99: res.p99, note: note})
		b.extras[fmt.Sprintf("%s.failed.%d", id, n)] = float64(res.failed)
		b.extras[fmt.Sprintf("%s.waithold.%d", id, n)] = ratio
		b.extras[fmt.Sprintf("%s.meanwaithold.%d", id, n)] = meanRatio
		b.extras[fmt.Sprintf("%s.outofturn.%d", id, n)] = float64(st.outOfTurn)
		b.logf("%-3s %-44s %2d clients: %9.0f ops/s  p50 %-9s p99 %-9s %s", id, name, n, res.ops,
			fmtDur(res.p50), fmtDur(res.p99), note)
	}
	return nil
}

// leasefsRows runs rows 1a–1d, 8 and 8g on one daemon mounted in the
// temporary directory.
func (b *bench) leasefsRows() error {
	ids := map[string]string{"1a": nameLease, "1e": nameLeaseNS, "1b": nameRenew, "1c": nameHandle, "1d": nameQueue, "8": nameKill, "8g": nameKillGo}
	if !b.wantAny(ids) {
		return nil
	}
	mp := filepath.Join(b.tmp, "mnt")
	d, _, err := b.startLeasefs(filepath.Join(b.tmp, "state"), mp, b.profileArgs()...)
	if err != nil {
		return err
	}
	defer d.stop()
	b.logf("leasefs mounted on %s (pid %d)", mp, d.pid)
	if b.prof, err = b.profilerOf(d); err != nil {
		return err
	}
	defer func() { b.prof = profileClient{} }()
	if err := b.cycleRows(mp, [4]string{"1a", "1b", "1c", "1d"}, [4]string{nameLease, nameRenew, nameHandle, nameQueue}); err != nil {
		return err
	}
	if err := b.cellRow("1e", nameLeaseNS, namespacedLeaseCycle(mp)); err != nil {
		return err
	}
	for _, p := range []string{"block", "mutex"} {
		if err := b.prof.save("leasefs."+p+".pb.gz", p, time.Minute); err != nil {
			return err
		}
	}
	if err := b.killRow("8", nameKill, mp, holderFlock); err != nil {
		return err
	}
	return b.killRow("8g", nameKillGo, mp, holderGo)
}

// cycleRows runs the four cycles of a mount on mp under the given row ids
// and names: the lease cycle, the renew, the handle-lease cycle and the
// queue on one name.
func (b *bench) cycleRows(mp string, ids, names [4]string) error {
	if err := b.cellRow(ids[0], names[0], leaseCycle(mp, "lease")); err != nil {
		return err
	}
	if err := b.cellRow(ids[1], names[1], renewCycle(mp)); err != nil {
		return err
	}
	if err := b.cellRow(ids[2], names[2], handleCycle(mp, "handle")); err != nil {
		return err
	}
	return b.queueRow(ids[3], names[3], mp)
}

// Row names, shared by the table and the targets.
const (
	nameLease   = "leasefs lease cycle (create+read+close+unlink)"
	nameLeaseNS = "same as 1a, each client in its own namespace"
	nameRenew   = "leasefs renew (pwrite token)"
	nameHandle  = "leasefs handle-lease cycle (open+flock+unlock+close)"
	nameQueue   = "leasefs one name, N clients queueing (blocking flock)"
	nameKill    = "leasefs SIGKILL holder → blocked successor granted"
	nameKillGo  = "same, the holder a Go process (this program)"
	nameStore   = "filestore.Store in-process Reserve+End"
	nameMemL    = "go-fuse in-memory ceiling: lease cycle (as 1a)"
	nameMemR    = "go-fuse in-memory ceiling: renew (as 1b)"
	nameMemH    = "go-fuse in-memory ceiling: handle cycle (as 1c)"
	nameDurL    = "durable ceiling: lease cycle (as 1a)"
	nameDurR    = "durable ceiling: renew (as 1b)"
	nameDurH    = "durable ceiling: handle cycle (as 1c)"
	nameDurQ    = "durable ceiling: one name, N queueing (as 1d)"
	nameRename  = "floor: 300 B temp file+fsync+rename+dir fsync"
	nameFsync   = "floor: 300 B pwrite+fdatasync"
	nameEtcdD   = "etcd Mutex Lock+Unlock, distinct keys"
	nameEtcdS   = "etcd Mutex Lock+Unlock, one shared key"
	nameRedisA  = "Redis SET NX PX+DEL, appendfsync always"
	nameRedisE  = "Redis SET NX PX+DEL, appendfsync everysec"
	nameScaleFm = "leasefs with %d live leases"
	nameEtcdPut = "etcd Put of the client's own key, 300 B"
	// Rows 9a–9f (11a–11f on the etcd binary): the same daemon on the
	// etcd store.
	nameEtcdLease  = "leasefs on etcd: lease cycle (as 1a)"
	nameEtcdRenew  = "leasefs on etcd: renew (as 1b)"
	nameEtcdHandle = "leasefs on etcd: handle-lease cycle (as 1c)"
	nameEtcdQueue  = "leasefs on etcd: one name, N queueing (as 1d)"
	nameEtcdNS     = "leasefs on etcd: lease cycle, a namespace per client (as 1e)"
	nameEtcdFanout = "leasefs on etcd: lease cycle, 1 client, %d idle mounts"
)
