package main

import (
	"bytes"
	"context"
	"fmt"
	"github.com/leasefs/leasefs/filestore"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/leasecore"
)

// scaleFlags are the daemon flags of the scale rows: no planted lease
// expires during the run and one uid may hold them all.
var scaleFlags = []string{"--lease-duration", "1000h", "--max-leases-per-uid", "10000000"}

// recordTemplate is the shape of a live token-lease record as the daemon
// writes it (docs/PROTOCOL.md §4.3): its lines, with the per-lease values
// replaced when planting.
type recordTemplate struct {
	lines []string // "key = value", in the daemon's order
}

// sampleRecord starts the daemon on a fresh state directory, reserves one
// name through the mount, stops the daemon and returns the shape of the
// record it wrote.
func (b *bench) sampleRecord() (recordTemplate, error) {
	base := filepath.Join(b.tmp, "sample")
	state, mp := filepath.Join(base, "state"), filepath.Join(base, "mnt")
	d, _, err := b.startLeasefs(state, mp, scaleFlags...)
	if err != nil {
		return recordTemplate{}, err
	}
	p := filepath.Join(mp, "sample")
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
	if err != nil {
		d.stop()
		return recordTemplate{}, fmt.Errorf("reserve %s: %w", p, err)
	}
	_ = unix.Close(fd)
	d.stop()
	recs, _ := filepath.Glob(filepath.Join(state, filestore.LeasesDir, "lease-*.toml"))
	if len(recs) != 1 {
		return recordTemplate{}, fmt.Errorf("want one record in %s after one reservation, found %d: the state layout changed",
			filepath.Join(state, filestore.LeasesDir), len(recs))
	}
	data, err := os.ReadFile(recs[0])
	if err != nil {
		return recordTemplate{}, err
	}
	var t recordTemplate
	for line := range strings.SplitSeq(strings.TrimSpace(string(data)), "\n") {
		t.lines = append(t.lines, line)
	}
	for _, k := range []string{"lease_id", "thread", "generation", "started_at", "heartbeat_at", "token_hash", "status", "mode"} {
		if !t.has(k) {
			return recordTemplate{}, fmt.Errorf("record %s has no %s: the record format changed", recs[0], k)
		}
	}
	_ = os.RemoveAll(base)
	return t, nil
}

func (t recordTemplate) has(key string) bool {
	for _, l := range t.lines {
		if k, _, ok := strings.Cut(l, " = "); ok && k == key {
			return true
		}
	}
	return false
}

// render returns the record of one planted lease.
func (t recordTemplate) render(id, resource string, gen uint64, now, hash string) []byte {
	var buf bytes.Buffer
	for _, l := range t.lines {
		k, _, _ := strings.Cut(l, " = ")
		switch k {
		case "lease_id":
			l = k + " = " + strconv.Quote(id)
		case "thread":
			l = k + " = " + strconv.Quote(resource)
		case "generation":
			l = k + " = " + strconv.FormatUint(gen, 10)
		case "started_at", "heartbeat_at":
			l = k + " = " + strconv.Quote(now)
		case "token_hash":
			l = k + " = " + strconv.Quote(hash)
		}
		buf.WriteString(l)
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}

// plant writes n live token-lease records with distinct resources and
// generations 1..n into state, in parallel.
func plant(state string, t recordTemplate, n int) error {
	dir := filepath.Join(state, filestore.LeasesDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	hash := leasecore.HashToken(leasecore.NewToken()) // nobody renews planted leases
	workers := max(4, 2*runtime.NumCPU())
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				id := leasecore.NewLeaseID()
				if err := leasecore.ValidateLeaseID(id); err != nil {
					errs <- err
					return
				}
				data := t.render(id, fmt.Sprintf("planted-%06d", i), uint64(i+1), now, hash)
				if err := os.WriteFile(filepath.Join(dir, id+".toml"), data, 0o600); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// scaleRows runs row 7 for every count of planted live leases: the daemon's
// start (spawn until the mount answers statfs), its VmRSS then, a readdir
// of every name, "leasefs ls" with the daemon running, and the p50 of an
// open(O_CREAT|O_EXCL) reservation among them.
func (b *bench) scaleRows() error {
	if !b.want("7", fmt.Sprintf(nameScaleFm, 0)) {
		return nil
	}
	t, err := b.sampleRecord()
	if err != nil {
		return err
	}
	for _, n := range b.cfg.scaleNs {
		if b.ctx.Err() != nil {
			return nil
		}
		if err := b.scaleOne(t, n); err != nil {
			return fmt.Errorf("7 with %d leases: %w", n, err)
		}
	}
	return nil
}

func (b *bench) scaleOne(t recordTemplate, n int) error {
	base := filepath.Join(b.tmp, fmt.Sprintf("scale-%d", n))
	defer os.RemoveAll(base)
	state, mp := filepath.Join(base, "state"), filepath.Join(base, "mnt")
	t0 := time.Now()
	if err := plant(state, t, n); err != nil {
		return err
	}
	b.logf("7   planted %d records in %v", n, time.Since(t0).Round(time.Millisecond))
	// Leases that accumulated over a daemon's life are on disk when it
	// restarts: write the planted ones back first, or the start would pay
	// for flushing them (its checkpoint syncs the records directory).
	t0 = time.Now()
	if err := syncFS(state); err != nil {
		return err
	}
	b.logf("7   wrote them back (syncfs) in %v", time.Since(t0).Round(time.Millisecond))
	// The first start reads every planted record from its file; the
	// daemon writes the record cache (docs/PROTOCOL.md §4.3) when it
	// stops, and a restart — what a daemon with this many leases does —
	// reads that instead.
	d, firstTook, err := b.startLeasefs(state, mp, scaleFlags...)
	if err != nil {
		return err
	}
	// Restart, readdir and ls are each the median of scaleRepeats runs:
	// single runs on this machine vary by a fifth.
	var stops, starts []time.Duration
	for range b.cfg.scaleRepeats {
		t0 = time.Now()
		d.stop()
		stops = append(stops, time.Since(t0))
		var took time.Duration
		if d, took, err = b.startLeasefs(state, mp, scaleFlags...); err != nil {
			return err
		}
		starts = append(starts, took)
	}
	defer d.stop()
	stopTook, startTook := quantile(stops, 0.5), quantile(starts, 0.5)
	rss, err := rssBytes(d.pid)
	if err != nil {
		return err
	}

	var readdirs, lss []time.Duration
	names, stopped := 0, false
	for range b.cfg.scaleRepeats {
		took, listed, err := timedReaddir(mp, stepLimit)
		if err != nil {
			return fmt.Errorf("readdir: %w", err)
		}
		if listed >= 0 && listed != n {
			return fmt.Errorf("readdir of the mount lists %d names, planted %d (did the daemon refuse the records? log:\n%s)",
				listed, n, lastLines(d.log(), 20))
		}
		readdirs = append(readdirs, took)
		if names = listed; listed < 0 {
			break // stopped: the next would be as slow
		}
	}
	for range b.cfg.scaleRepeats {
		t0 = time.Now()
		lsCtx, cancel := context.WithTimeout(b.ctx, stepLimit)
		ls := exec.CommandContext(lsCtx, b.bin, "ls", "--state", state)
		ls.Stdout = io.Discard
		var lsErr bytes.Buffer
		ls.Stderr = &lsErr
		err = ls.Run()
		took := time.Since(t0)
		stopped = lsCtx.Err() != nil
		cancel()
		if stopped {
			lss = append(lss, stepLimit)
			break
		}
		if err != nil {
			return fmt.Errorf("leasefs ls: %w: %s", err, lsErr.String())
		}
		lss = append(lss, took)
	}
	readdir, lsTook := quantile(readdirs, 0.5), quantile(lss, 0.5)
	if stopped {
		lsTook = stepLimit
	}
	if names < 0 {
		readdir = stepLimit
	}

	lat := make([]time.Duration, 0, b.cfg.reserveN)
	runtime.LockOSThread()
	for k := range b.cfg.reserveN {
		p := filepath.Join(mp, fmt.Sprintf("fresh-%d", k))
		s := time.Now()
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
		took := time.Since(s)
		if err != nil {
			runtime.UnlockOSThread()
			return fmt.Errorf("reserve %s: %w", p, err)
		}
		lat = append(lat, took)
		_ = unix.Close(fd)
		if err := unix.Unlink(p); err != nil {
			runtime.UnlockOSThread()
			return fmt.Errorf("unlink %s: %w", p, err)
		}
	}
	runtime.UnlockOSThread()
	var sum time.Duration
	for _, l := range lat {
		sum += l
	}
	r := row{id: "7", name: fmt.Sprintf(nameScaleFm, n), ops: float64(len(lat)) / sum.Seconds(),
		p50: quantile(lat, 0.5), p99: quantile(lat, 0.99),
		note: fmt.Sprintf("reserve alone; first start %s, stop %s, restart %s, RSS %.1f MiB, readdir %s, ls %s",
			fmtDur(firstTook), fmtDur(stopTook), fmtDur(startTook), float64(rss)/(1<<20), capped(readdir, names < 0), capped(lsTook, stopped))}
	b.rows = append(b.rows, r)
	key := strconv.Itoa(n)
	b.extras["7.start."+key] = startTook.Seconds()
	b.extras["7.firststart."+key] = firstTook.Seconds()
	b.extras["7.rss."+key] = float64(rss)
	b.extras["7.readdir."+key] = readdir.Seconds()
	b.extras["7.ls."+key] = lsTook.Seconds()
	if stopped {
		b.extras["7.lsstopped."+key] = 1
	}
	if names < 0 {
		b.extras["7.readdirstopped."+key] = 1
	}
	b.extras["7.p50."+key] = r.p50.Seconds()
	b.logf("7   %-44s p50 %s p99 %s %s", r.name, fmtDur(r.p50), fmtDur(r.p99), r.note)
	return nil
}

// stepLimit bounds the readdir and the ls of a scale row, so that a slow
// listing cannot push the whole command past its time budget; a step that
// hits it is reported as "> limit" and counted as the limit.
const stepLimit = 20 * time.Second

// capped prints a step's duration, as a lower bound when it was stopped.
func capped(d time.Duration, stopped bool) string {
	if stopped {
		return "> " + fmtDur(d) + " (stopped)"
	}
	return fmtDur(d)
}

// timedReaddir lists every name of dir and returns how long it took and
// how many names there were; names is -1 when the listing did not finish
// within limit (it is then left running and its duration is limit).
func timedReaddir(dir string, limit time.Duration) (time.Duration, int, error) {
	type out struct {
		took time.Duration
		n    int
		err  error
	}
	c := make(chan out, 1)
	go func() {
		t0 := time.Now()
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			c <- out{err: err}
			return
		}
		defer unix.Close(fd)
		// The buffer glibc's readdir(3) uses, so as ls(1) and Python's
		// os.listdir list a directory (Go's os package reads 8 KiB at a
		// time; since Linux 6.16 a FUSE READDIR is as large as the
		// caller's buffer, up to the connection's max_pages).
		buf := make([]byte, 32<<10)
		var names []string
		for {
			m, err := unix.Getdents(fd, buf)
			if err != nil {
				c <- out{err: err}
				return
			}
			if m == 0 {
				break
			}
			_, _, names = unix.ParseDirent(buf[:m], -1, names)
		}
		c <- out{took: time.Since(t0), n: len(names)}
	}()
	select {
	case o := <-c:
		return o.took, o.n, o.err
	case <-time.After(limit):
		return limit, -1, nil
	}
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// syncFS writes back every dirty page of the filesystem holding dir
// (syncfs(2)).
func syncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}
