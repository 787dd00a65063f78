package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// clientCounts are the concurrency levels of every cell row.
var clientCounts = []int{1, 4, 16, 64}

// config is the parsed command line.
type config struct {
	quick    bool
	only     *regexp.Regexp // nil: every row
	out      string         // directory of BENCHMARKS.md; the SVG goes to out/bench
	duration time.Duration  // measured window of one cell
	warmup   time.Duration  // unmeasured run before it
	killN    int            // samples of the kill-to-grant row
	scaleNs  []int          // live lease counts of the scale rows
	reserveN int            // reservations timed per scale row
	// scaleRepeats is how many restarts, readdirs and ls runs a scale row
	// takes the median of.
	scaleRepeats int
	// clients are the client counts of the cell rows: clientCounts
	// unless -clients names fewer.
	clients []int
	// profile, when set, is the directory for the daemon's profiles during
	// the leasefs rows (profile.go).
	profile string
	// trace: the cells of -profile record execution traces instead of
	// CPU profiles (profile.go).
	trace bool
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fl := flag.NewFlagSet("bench", flag.ContinueOnError)
	fl.SetOutput(stderr)
	quick := fl.Bool("quick", false, "tiny durations and sample counts (a smoke test, numbers meaningless)")
	only := fl.String("only", "", "run only rows whose id or name matches this regular expression (e.g. '^1a|^4')")
	out := fl.String("out", "", "directory for BENCHMARKS.md, with the chart in DIR/bench (default: the module root for a full run; none with -only or -quick)")
	dur := fl.Duration("duration", time.Second, "measured time of one cell")
	clients := fl.String("clients", "1,4,16,64", "comma-separated client counts of the cell rows (a subset is a partial run, e.g. -clients 1 -duration 30s for a sustained one-client cycle)")
	warm := fl.Duration("warmup", 200*time.Millisecond, "unmeasured warm-up of one cell")
	profile := fl.String("profile", "", "write the daemon's CPU profile of each 1a–1c cell and its block and mutex profiles to this directory (go tool pprof reads them)")
	trace := fl.Bool("trace", false, "with -profile: each 1a–1c cell records the daemon's execution trace (DIR/1a-1clients.trace, for go tool trace) instead of its CPU profile")
	if err := fl.Parse(args); err != nil {
		return config{}, err
	}
	if fl.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fl.Args())
	}
	if *trace && *profile == "" {
		return config{}, errors.New("-trace needs -profile DIR")
	}
	cfg := config{quick: *quick, out: *out, duration: *dur, warmup: *warm, killN: 100, profile: *profile,
		trace:   *trace,
		scaleNs: []int{100, 1000, 10000, 100000}, reserveN: 200, scaleRepeats: 3}
	if *quick {
		cfg.duration, cfg.warmup, cfg.killN, cfg.reserveN, cfg.scaleRepeats = 200*time.Millisecond, 50*time.Millisecond, 5, 20, 1
		cfg.scaleNs = []int{100, 1000}
	}
	var err error
	if cfg.clients, err = parseClients(*clients); err != nil {
		return config{}, err
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			return config{}, fmt.Errorf("-only: %w", err)
		}
		cfg.only = re
	}
	if cfg.out == "" && (cfg.only != nil || cfg.quick || !slices.Equal(cfg.clients, clientCounts)) {
		// A partial or quick run must not replace the repository's
		// BENCHMARKS.md, the record of a full run.
		return cfg, nil
	}
	if cfg.out == "" {
		root, err := moduleRoot()
		if err != nil {
			return config{}, err
		}
		cfg.out = root
	}
	return cfg, nil
}

// parseClients parses the -clients list: distinct counts of 1 to 1024,
// comma-separated. Errors: a malformed, out-of-range or repeated count.
func parseClients(list string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 1024 || slices.Contains(out, n) {
			return nil, fmt.Errorf("-clients: %q is not a list of distinct counts from 1 to 1024", list)
		}
		out = append(out, n)
	}
	return out, nil
}

// moduleRoot returns the directory of the leasefs module whose daemon this
// command measures: the parent of the bench module (bench/go.mod), which
// replaces the product by it.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside the bench module (go env GOMOD is empty): run it as cd bench && go run .")
	}
	root := filepath.Dir(filepath.Dir(gomod))
	if data, err := os.ReadFile(filepath.Join(root, "go.mod")); err != nil || !strings.HasPrefix(string(data), "module github.com/leasefs/leasefs\n") {
		return "", fmt.Errorf("%s is not the leasefs module: run the bench from its bench/ directory", root)
	}
	return root, nil
}

// bench holds one run: its temporary directory, the services it started
// and the results so far. Not safe for concurrent use.
type bench struct {
	ctx   context.Context
	cfg   config
	log   io.Writer
	tmp   string
	root  string // module root
	bin   string // the leasefs binary built from the tree
	start time.Time
	// loadStart is /proc/loadavg when the run began: the machine is shared.
	loadStart string
	rows      []row
	extras    map[string]float64 // named measurements for the targets
	rpcTables []rpcTable         // what each system call cost each etcd server
	// prof fetches the profiles of the daemon under test while the
	// leasefs rows run (the zero value otherwise, or without -profile).
	prof profileClient
	undo []func() // cleanups, run in reverse
}

func newBench(ctx context.Context, cfg config, log io.Writer) (*bench, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "leasefs-bench-")
	if err != nil {
		return nil, err
	}
	b := &bench{ctx: ctx, cfg: cfg, log: log, tmp: tmp, root: root, start: time.Now(), loadStart: loadAvg(), extras: map[string]float64{}}
	b.onClose(func() { _ = os.RemoveAll(tmp) })
	return b, nil
}

// onClose registers f to run at close, before the cleanups registered earlier.
func (b *bench) onClose(f func()) { b.undo = append(b.undo, f) }

// close runs every cleanup, newest first.
func (b *bench) close() {
	for i := len(b.undo) - 1; i >= 0; i-- {
		b.undo[i]()
	}
	b.undo = nil
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "[%5.1fs] "+format+"\n", append([]any{time.Since(b.start).Seconds()}, args...)...)
}

// want reports whether the row with this id and name is selected by -only.
func (b *bench) want(id, name string) bool {
	return b.cfg.only == nil || b.cfg.only.MatchString(id) || b.cfg.only.MatchString(id+" "+name)
}

// wantAny reports whether any of the ids is selected.
func (b *bench) wantAny(ids map[string]string) bool {
	for id, name := range ids {
		if b.want(id, name) {
			return true
		}
	}
	return false
}

// row is one line of the table.
type row struct {
	id      string // "1a", "5s", …: the key of the targets and of -only
	name    string
	clients int // 0 when not applicable
	ops     float64
	p50     time.Duration
	p99     time.Duration
	note    string
}

// result is the outcome of one cell.
type result struct {
	ops      float64 // completed cycles per second, all clients
	p50, p99 time.Duration
	n        int // measured cycles
	failed   int // cycles that failed (any errno), not counted in n
	firstErr error
}

// cycle is one client's operation; it returns an error to count a failure.
type cycle func() error

// runCell runs clients goroutines, each on its own locked OS thread, each
// calling the cycle that setup(i) returned in a loop: first for the
// warm-up, then for the measured window. A cycle counts, with its latency,
// when it completes inside the window; when fewer than clients cycles have
// completed by the window's end (cycles slower than the window), the window
// is extended until that many have. ops/s is the count over the window's
// length. setup runs on the client's thread, teardown (when not nil) after
// the loop on the same thread.
func (b *bench) runCell(clients int, setup func(i int) (cycle, func(), error)) (result, error) {
	type clientOut struct {
		lat     []time.Duration
		failed  int
		err     error
		first   error
		lastEnd time.Time
	}
	outs := make([]clientOut, clients)
	var ready, done sync.WaitGroup
	startC := make(chan struct{})
	var measureFrom, measureTo time.Time
	var counted atomic.Int64
	minCount := int64(clients)
	ready.Add(clients)
	done.Add(clients)
	for i := range clients {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			o := &outs[i]
			c, teardown, err := setup(i)
			ready.Done()
			if err != nil {
				o.err = err
				return
			}
			if teardown != nil {
				defer teardown()
			}
			<-startC
			o.lat = make([]time.Duration, 0, 4096)
			for {
				t0 := time.Now()
				if b.ctx.Err() != nil || (!t0.Before(measureTo) && counted.Load() >= minCount) {
					return
				}
				err := c()
				end := time.Now()
				if end.Before(measureFrom) || (!end.Before(measureTo) && counted.Load() >= minCount) {
					continue
				}
				counted.Add(1)
				o.lastEnd = end
				if err != nil {
					o.failed++
					if o.first == nil {
						o.first = err
					}
					continue
				}
				o.lat = append(o.lat, end.Sub(t0))
			}
		}()
	}
	ready.Wait()
	measureFrom = time.Now().Add(b.cfg.warmup)
	measureTo = measureFrom.Add(b.cfg.duration)
	close(startC)
	done.Wait()
	var res result
	var all []time.Duration
	windowEnd := measureTo
	for _, o := range outs {
		if o.err != nil {
			return result{}, o.err
		}
		all = append(all, o.lat...)
		res.failed += o.failed
		if res.firstErr == nil {
			res.firstErr = o.first
		}
		if o.lastEnd.After(windowEnd) {
			windowEnd = o.lastEnd
		}
	}
	res.n = len(all)
	res.ops = float64(len(all)) / windowEnd.Sub(measureFrom).Seconds()
	res.p50, res.p99 = quantile(all, 0.50), quantile(all, 0.99)
	return res, nil
}

// quantile returns the q-quantile (nearest rank) of lat, sorting it; 0 for
// an empty slice.
func quantile(lat []time.Duration, q float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	if !slices.IsSorted(lat) {
		slices.Sort(lat)
	}
	i := max(int(math.Ceil(q*float64(len(lat))))-1, 0)
	return lat[i]
}

// cellRow runs one workload for every client count and appends its rows.
// setup builds a client's cycle for a given client count.
func (b *bench) cellRow(id, name string, setup func(clients, i int) (cycle, func(), error)) error {
	return b.cellRowNote(id, name, setup, nil)
}

// cellRowNote is cellRow with a per-cell note computed after the cell.
func (b *bench) cellRowNote(id, name string, setup func(clients, i int) (cycle, func(), error),
	note func(clients int, res result) string) error {
	if !b.want(id, name) {
		return nil
	}
	for _, n := range b.cfg.clients {
		if err := b.ctx.Err(); err != nil {
			return nil
		}
		profiled := b.prof.cell(fmt.Sprintf("%s-%dclients", id, n), b.cfg.warmup, b.cfg.duration)
		res, err := b.runCell(n, func(i int) (cycle, func(), error) { return setup(n, i) })
		if perr := profiled(); perr != nil && err == nil {
			err = perr
		}
		if err != nil {
			return fmt.Errorf("%s %s, %d clients: %w", id, name, n, err)
		}
		r := row{id: id, name: name, clients: n, ops: res.ops, p50: res.p50, p99: res.p99}
		b.extras[fmt.Sprintf("%s.failed.%d", id, n)] = float64(res.failed)
		if note != nil {
			r.note = note(n, res)
		} else if res.failed > 0 {
			r.note = fmt.Sprintf("%d failed (%v)", res.failed, res.firstErr)
		}
		b.rows = append(b.rows, r)
		b.logf("%-3s %-44s %2d clients: %9.0f ops/s  p50 %-9s p99 %-9s %s", id, name, n, res.ops,
			fmtDur(res.p50), fmtDur(res.p99), r.note)
	}
	return nil
}

// find returns the row with id and clients.
func (b *bench) find(id string, clients int) (row, bool) { return findRow(b.rows, id, clients) }

// runAll runs every selected group of rows in table order.
func (b *bench) runAll() error {
	groups := []func() error{
		b.leasefsRows, // 1a–1d and the kill-to-grant row (8)
		b.storeRows,   // 2
		b.memfsRows,   // 3a–3c, and 3d–3g on the durable ceiling
		b.floorRows,   // 4r, 4f
		b.etcdRows,    // 5d, 5s, 5p, 9a–9f; on the etcd binary 10d, 10s, 10p, 11a–11f
		b.redisRows,   // 6a, 6e
		b.scaleRows,   // 7
	}
	for _, g := range groups {
		if b.ctx.Err() != nil {
			return nil
		}
		if err := g(); err != nil {
			return err
		}
	}
	return nil
}

// fmtDur prints a latency with three significant digits.
func fmtDur(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.3gµs", float64(d)/float64(time.Microsecond))
	case d < time.Second:
		return fmt.Sprintf("%.3gms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.3gs", d.Seconds())
	}
}
