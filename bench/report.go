package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/leasefs/leasefs/internal/procfs"
	"golang.org/x/sys/unix"
)

// target is one goal checked in the run, from rows measured in the same run.
type target struct {
	what    string
	value   float64
	unit    string // "" for a ratio
	goal    float64
	atMost  bool    // PASS when value ≤ goal, else when value ≥ goal
	slack   float64 // with atMost: PASS when value ≤ goal + slack
	bound   bool    // value is a lower bound (the step was stopped)
	info    bool    // a comparison without a goal
	missing string
}

func (t target) verdict() string {
	switch {
	case t.missing != "":
		return "n/a"
	case t.info:
		return "-"
	case t.atMost && t.value <= t.goal+t.slack, !t.atMost && t.value >= t.goal:
		return "PASS"
	default:
		return "MISS"
	}
}

// valueText prints the measured value, "> v" for a lower bound.
func (t target) valueText() string {
	v := fmt.Sprintf("%.2f%s", t.value, t.unit)
	if t.bound {
		v = "> " + v
	}
	return v
}

// goalText is the goal with its comparison, e.g. "≤ 1.3" or "≤ 4 (+0.05)".
func (t target) goalText() string {
	cmp := "≥"
	if t.atMost {
		cmp = "≤"
	}
	g := fmt.Sprintf("%s %g%s", cmp, t.goal, t.unit)
	if t.slack > 0 {
		g += fmt.Sprintf(" (+%g)", t.slack)
	}
	return g
}

func (t target) line() string {
	goal := "target " + t.goalText()
	if t.info {
		goal = "no target"
	}
	if t.missing != "" {
		return fmt.Sprintf("%-4s  %-76s  %-12s (%s)", t.verdict(), t.what, "not run", goal) + ": " + t.missing
	}
	val := t.valueText()
	return fmt.Sprintf("%-4s  %-76s  %-12s (%s)", t.verdict(), t.what, val, goal)
}

// report is the finished run.
type report struct {
	rows    []row
	targets []target
	machine [][2]string
	took    time.Duration
	quick   bool
	rpc     []rpcTable
}

func (b *bench) report() report {
	return report{rows: b.rows, targets: b.targets(), machine: b.machine(), took: time.Since(b.start), quick: b.cfg.quick, rpc: b.rpcTables}
}

// ratio builds a throughput ratio target from two cells.
func (b *bench) ratio(what, numID string, numN int, denID string, denN int, goal float64) target {
	t := target{what: what, goal: goal}
	num, ok1 := b.find(numID, numN)
	den, ok2 := b.find(denID, denN)
	switch {
	case !ok1:
		t.missing = fmt.Sprintf("row %s at %d clients", numID, numN)
	case !ok2:
		t.missing = fmt.Sprintf("row %s at %d clients", denID, denN)
	case den.ops == 0:
		t.missing = fmt.Sprintf("row %s at %d clients measured no completed cycle", denID, denN)
	default:
		t.value = num.ops / den.ops
	}
	return t
}

// compare builds a ratio of two cells that has no goal: how the etcd
// store compares with the file store and with etcd's own Mutex.
func (b *bench) compare(what, numID string, numN int, denID string, denN int) target {
	t := b.ratio(what, numID, numN, denID, denN, 0)
	t.info = true
	return t
}

// extra builds a target from a named measurement.
func (b *bench) extra(what, key string, scale float64, unit string, goal float64, atMost bool) target {
	t := target{what: what, unit: unit, goal: goal, atMost: atMost}
	v, ok := b.extras[key]
	if !ok {
		t.missing = "not measured (" + key + ")"
		return t
	}
	t.value = v * scale
	return t
}

// info makes t a measurement shown beside the targets, without a goal.
func info(t target) target {
	t.info = true
	return t
}

func (b *bench) targets() []target {
	ts := []target{
		b.ratio("lease cycle, 1 client: leasefs (1a) / Redis always (6a)", "1a", 1, "6a", 1, 1.0),
		b.compare("lease cycle, 1 client, best reachable: durable ceiling (3d) / Redis always (6a)", "3d", 1, "6a", 1),
		b.compare("lease cycle, 1 client: leasefs (1a) / durable ceiling (3d)", "1a", 1, "3d", 1),
		b.ratio("lease cycle, 16 clients: leasefs (1a) / etcd distinct-key Mutex (5d)", "1a", 16, "5d", 16, 2),
		b.compare("lease cycle, 16 clients, best reachable: durable ceiling (3d) / etcd (5d)", "3d", 16, "5d", 16),
		b.ratio("lease cycle, 16 clients: leasefs (1a) / go-fuse in-memory (3a)", "1a", 16, "3a", 16, 0.5),
		b.compare("lease cycle, 16 clients, best reachable: durable ceiling (3d) / go-fuse in-memory (3a)", "3d", 16, "3a", 16),
		b.compare("lease cycle, 16 clients: leasefs (1a) / durable ceiling (3d)", "1a", 16, "3d", 16),
		b.compare("lease cycle, 16 clients: a namespace per client (1e) / one directory (1a)", "1e", 16, "1a", 16),
		b.ratio("renew, 1 client: leasefs (1b) / 300 B pwrite+fdatasync (4f)", "1b", 1, "4f", 1, 0.5),
		b.compare("renew, 1 client, best reachable: durable ceiling (3e) / 300 B pwrite+fdatasync (4f)", "3e", 1, "4f", 1),
		b.ratio("handle-lease cycle, 1 client: leasefs (1c) / Redis always (6a)", "1c", 1, "6a", 1, 1.0),
		b.compare("handle-lease cycle, 1 client, best reachable: durable ceiling (3f) / Redis (6a)", "3f", 1, "6a", 1),
		b.ratio("one name, 16 clients: leasefs (1d) / etcd shared-key Mutex (5s)", "1d", 16, "5s", 16, 10),
		b.compare("one name, 16 clients, best reachable: durable ceiling (3g) / etcd (5s)", "3g", 16, "5s", 16),
		b.extra("one name, 16 clients: failed calls (1d)", "1d.failed.16", 1, "", 0, true),
		b.extra("one name, 16 clients: p99 wait / mean hold (1d)", "1d.waithold.16", 1, "", 20, true),
		b.extra("one name, 16 clients: grants out of turn (1d)", "1d.outofturn.16", 1, "", 0, true),
		info(b.extra("one name, 16 clients, strictly first come, first served: grants out of turn on the durable ceiling (3g), the measure's own noise", "3g.outofturn.16", 1, "", 0, true)),
		info(b.extra("one name, 16 clients, best reachable: mean (not p99) wait / mean hold on the durable ceiling (3g), strictly first come, first served", "3g.meanwaithold.16", 1, "", 0, true)),
		b.extra("100k leases: daemon restart (record cache)", "7.start.100000", 1, " s", 1, true),
		info(b.extra("100k leases: first daemon start (no record cache)", "7.firststart.100000", 1, " s", 0, true)),
		b.extra("100k leases: daemon RSS after start", "7.rss.100000", 1.0/(1<<20), " MiB", 100, true),
		b.extra("100k leases: readdir of the mount root", "7.readdir.100000", 1, " s", 0.5, true),
		b.extra("100k leases: leasefs ls (daemon running)", "7.ls.100000", 1, " s", 1, true),
		b.compare("lease cycle, 1 client: leasefs on etcd (9a) / on the file store (1a)", "9a", 1, "1a", 1),
		b.compare("handle-lease cycle, 1 client: leasefs on etcd (9c) / on the file store (1c)", "9c", 1, "1c", 1),
	}
	for i := range ts {
		if strings.HasPrefix(ts[i].what, "100k leases: leasefs ls") && b.extras["7.lsstopped.100000"] == 1 {
			ts[i].bound = true
		}
		if strings.HasPrefix(ts[i].what, "100k leases: readdir") && b.extras["7.readdirstopped.100000"] == 1 {
			ts[i].bound = true
		}
	}
	ts = append(ts, b.etcdTargets(embeddedIDs, "embedded etcd")...)
	ts = append(ts, b.etcdTargets(binaryIDs, "etcd-server")...)
	r := target{what: "reserve p50 at 100k leases / at 100 (7)", goal: 1.2, atMost: true}
	hi, ok1 := b.extras["7.p50.100000"]
	lo, ok2 := b.extras["7.p50.100"]
	if ok1 && ok2 && lo > 0 {
		r.value = hi / lo
	} else {
		r.missing = "row 7 at 100 and 100000 leases"
	}
	ts = append(ts, r)
	k := target{what: "SIGKILL of a handle-lease holder → successor granted, p99 (8)", unit: " ms", goal: 10, atMost: true}
	if kr, ok := b.find("8", 0); ok {
		k.value = float64(kr.p99) / float64(time.Millisecond)
	} else {
		k.missing = "row 8"
	}
	return append(ts, k)
}

// machine describes where the run happened.
func (b *bench) machine() [][2]string {
	var m [][2]string
	add := func(k, v string) { m = append(m, [2]string{k, v}) }
	add("CPU", cpuModel())
	add("cores", fmt.Sprintf("%d (runtime.NumCPU)", runtime.NumCPU()))
	add("RAM", memTotal())
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		add("kernel", unix.ByteSliceToString(u.Sysname[:])+" "+unix.ByteSliceToString(u.Release[:])+" "+unix.ByteSliceToString(u.Machine[:]))
	}
	add("temp dir filesystem", tempFS(b.tmp))
	add("Go", runtime.Version())
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		add("redis-server", strings.TrimSpace(string(out)))
	}
	add("etcd", "go.etcd.io/etcd/server/v3 v3.7.3 embedded, client/v3 v3.7.3; go-redis v9.23.0")
	add("load average (1, 5, 15 min) at the start", b.loadStart)
	add("load average (1, 5, 15 min) at the end", loadAvg())
	add("date", b.start.UTC().Format("2006-01-02 15:04 MST"))
	return m
}

// loadAvg returns the three load averages of /proc/loadavg.
func loadAvg() string {
	la, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(la)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

func cpuModel() string {
	data, _ := os.ReadFile("/proc/cpuinfo")
	for line := range strings.SplitSeq(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func memTotal() string {
	data, _ := os.ReadFile("/proc/meminfo")
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			var kb int64
			if _, err := fmt.Sscan(rest, &kb); err == nil {
				return fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
			}
		}
	}
	return "unknown"
}

// tempFS names the filesystem holding dir: the mount with the longest
// mount point that contains it.
func tempFS(dir string) string {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		real = dir
	}
	best, ok := procfs.ContainingMount(procfs.Mounts(), real)
	if !ok {
		return "unknown"
	}
	return fmt.Sprintf("%s (%s on %s, temp dir %s)", best.FSType, best.Source, best.Point, filepath.Dir(real))
}

// text is the table and the targets, as printed on stdout.
func (r report) text() string {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tWORKLOAD\tCLIENTS\tOPS/S\tP50\tP99\tNOTES")
	for _, x := range r.rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", x.id, x.name, clientsCell(x), opsCell(x), fmtDur(x.p50), fmtDur(x.p99), x.note)
	}
	_ = tw.Flush()
	buf.WriteString("\nTargets (ratios of throughput, same run):\n")
	for _, t := range r.targets {
		buf.WriteString("  " + t.line() + "\n")
	}
	fmt.Fprintf(&buf, "\nTotal time %s.\n", r.took.Round(time.Second))
	return buf.String()
}

func clientsCell(x row) string {
	if x.clients == 0 {
		return "-"
	}
	return fmt.Sprint(x.clients)
}

func opsCell(x row) string {
	if x.ops == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", x.ops)
}

// write writes BENCHMARKS.md into out and throughput.svg into out/bench.
func (r report) write(out string) error {
	if err := os.MkdirAll(filepath.Join(out, "bench"), 0o755); err != nil {
		return err
	}
	svg, err := r.chart()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "bench", "throughput.svg"), svg, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "BENCHMARKS.md"), r.markdown(), 0o644)
}

func (r report) markdown() []byte {
	var b bytes.Buffer
	b.WriteString("# leasefs benchmarks\n\n")
	b.WriteString("Generated by `cd bench && go run .` (this file and [bench/throughput.svg](bench/throughput.svg) are its output; " +
		"`cd bench && go run . -h` lists the flags). ")
	if r.quick {
		b.WriteString("**This run used `-quick`: the numbers are a smoke test, not measurements.** ")
	}
	b.WriteString("Each cell runs its clients (goroutines, each on its own OS thread, doing the system calls itself) " +
		"for a short warm-up and then a fixed measured window; ops/s counts completed cycles of all clients in that window, " +
		"p50 and p99 are per cycle. The machine is small and shared with other work (see the load averages), so the numbers are noisy: " +
		"single cells of two runs minutes apart differed by up to 3×. The ratios below compare rows of one run.\n\n")
	b.WriteString("## Machine\n\n| | |\n| --- | --- |\n")
	for _, kv := range r.machine {
		fmt.Fprintf(&b, "| %s | %s |\n", kv[0], strings.ReplaceAll(kv[1], "|", "\\|"))
	}
	b.WriteString("\n## Targets\n\n| | measured | target | |\n| --- | --- | --- | --- |\n")
	for _, t := range r.targets {
		val := t.valueText()
		if t.missing != "" {
			val = "not run"
		}
		goal := t.goalText()
		if t.info {
			goal = "no target"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.what, val, goal, t.verdict())
	}
	b.WriteString("\n\"Best reachable\" rows measure what any daemon could do here: the durable ceiling (3d–3g) is the " +
		"in-memory go-fuse filesystem of 3a–3c, answering the same system calls, that makes every change a lease store must " +
		"persist durable before it answers (docs/PROTOCOL.md §4.3) at the least cost there is: one preallocated journal, one " +
		"pwrite + fdatasync shared by every change that arrived meanwhile (group commit), and the record file per ended " +
		"lease that the format requires, written behind; no token, hash, check or log. A " +
		"lease cycle makes two such changes (the reservation and the release), a renew one, a handle-lease cycle three " +
		"(reservation, flock, unlock), a hand-over in the queue two (the end and the grant). The kernel holds a directory's " +
		"lock across each create and unlink in it, so across the commit the daemon makes before it answers: in one directory " +
		"those commits run one after another, whatever the daemon does. A target above its best reachable value is out of " +
		"reach on this machine, whatever the store does. The p99 wait of a queue is bounded the other way: 16 clients that " +
		"queue again as soon as they unlock, served strictly first come, first served, each wait for the 15 ahead of them, " +
		"holds and hand-overs, so even the mean wait of the durable ceiling (3g) is many holds; a p99 wait of at most 20 " +
		"mean holds is out of reach when that mean already exceeds 20.\n")
	for _, t := range r.rpc {
		t.writeMarkdown(&b)
	}
	b.WriteString("\n## Results\n\n![throughput against clients](bench/throughput.svg)\n\n")
	b.WriteString("| id | workload | clients | ops/s | p50 | p99 | notes |\n| --- | --- | ---: | ---: | ---: | ---: | --- |\n")
	for _, x := range r.rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", x.id, x.name, clientsCell(x), opsCell(x),
			fmtDur(x.p50), fmtDur(x.p99), strings.ReplaceAll(x.note, "|", "\\|"))
	}
	b.WriteString(rowsDoc)
	fmt.Fprintf(&b, "\nThe run took %s.\n", r.took.Round(time.Second))
	return b.Bytes()
}

// rowsDoc says what each row does.
const rowsDoc = `
## What the rows do

- **1a** open(name, O_CREAT|O_EXCL|O_RDWR) + read the token + close + unlink, one name per client, through a real mount of the daemon built from the tree (docs/PROTOCOL.md §3).
- **1e** the cycle of 1a with each client in a namespace of its own (a directory made before the cell, §3): the kernel holds a directory's inode lock across every create and unlink in it, so across the commit the daemon makes before it answers; the commits of creates and unlinks in one directory cannot share an fdatasync, those in different directories can.
- **1b** one reserved name per client, the token written with pwrite at offset 0 per cycle: a renew (§4.2).
- **1c** open(O_CREAT|O_RDWR) of a free name (a reservation) + flock(LOCK_EX|LOCK_NB) (binds it as a handle lease) + flock(LOCK_UN) (ends it) + close (§6).
- **1d** every client on ONE name: open + blocking flock(LOCK_EX) + LOCK_UN + close. Wait is the time blocked in flock, hold the time from its return to LOCK_UN's. A grant is "out of turn" when it went to a client while another client, whose wait began at least 5 ms earlier, was still waiting; each client takes its own times just before its blocking flock call and just after it returns, so a wait begun less than 5 ms before another cannot be ordered and is not counted (the share with no tolerance is given too, and how much earlier than the grant's own the longest-waiting passed wait began). 0 is strict first come, first served (docs/PROTOCOL.md §8a); the durable ceiling (3g) serves strictly in order of arrival, so what it shows is the measure's own noise.
- **2** filestore.Open in this process, Reserve + End of the client's own name: the store without FUSE.
- **3a, 3b, 3c** the cycles of 1a, 1b and 1c against a minimal in-memory go-fuse filesystem (same mount options, no store): the FUSE ceiling.
- **3d, 3e, 3f, 3g** the cycles of 1a, 1b, 1c and 1d against the same filesystem made durable: each reservation, unlink, renew, lock and unlock returns after a group-committed 300-byte pwrite + fdatasync of a preallocated journal, every ended lease leaves a 300-byte record file written behind every 100 ms (no fsync; the oldest beyond 10,000 removed), and the lock is handed to blocked waiters first come, first served, as leasefs does: the durable ceiling, what a lease store could reach if it cost nothing but its commits and its history.
- **4r** the durable write behind every store change: 300-byte temp file + fsync + rename + fsync of the directory. **4f** 300-byte pwrite at offset 0 + fdatasync of a preallocated file.
- **5d, 5s, 5p** embedded etcd (one member, WAL fsync on), concurrency.Mutex Lock + Unlock per cycle, one session per client, on the client's own key (5d, compare with 1a) or on one shared key (5s, compare with 1d); 5p one Put of 300 B to the client's own key (compare with the renew). **10d, 10s, 10p** the same on the etcd binary (Debian's etcd-server, one member on loopback ports, WAL fsync on), when it is installed.
- **6a, 6e** a private redis-server with appendonly yes and appendfsync always (6a) or everysec (6e): SET key val NX PX 30000 + DEL of the client's own key.
- **7** N live token leases planted as records in a fresh state directory (the daemon's own record shape, §4.3) and written back with syncfs (as leases made over a daemon's life are on disk when it restarts), served with --lease-duration 1000h: first start is spawn until statfs of the mountpoint answers as FUSE, on the planted records alone; the daemon is then stopped (SIGTERM, which writes the record cache, docs/PROTOCOL.md §4.3) and started again, and restart — the start a daemon with this many leases makes — is measured the same way; stop and restart are the medians of three stop-and-start rounds; RSS is VmRSS right after the last restart; readdir lists every name through the mount with getdents64 and the 32 KiB buffer of glibc's readdir(3) (what ls and Python's os.listdir use), ls is ` + "`leasefs ls --state`" + ` with the daemon running, both the median of three runs; p50/p99 are of open(O_CREAT|O_EXCL) alone among them. readdir and ls are stopped after 20 s (shown as "> 20s (stopped)" and counted as 20 s), so a slow listing cannot stretch the run.
- **9a–9e** the cycles of 1a–1e through a mount of the same daemon on the etcd store (` + "`--store etcd://…`" + `, §8a) of the embedded etcd of 5d/5s: what the cluster round trips cost against the file store and against etcd's own Mutex on the same server. **9f** the lease cycle of one client on that mount while 0, 8, 24 and 64 other mounts of the same store sit idle (each its own daemon, state directory and mountpoint), with the idle daemons' CPU per cycle in total (and, on the etcd binary, etcd's): a change should cost the same however many mounts share the cluster. The note also gives the idle daemons' VmRSS at the end of the cell (sum, against the sum right after their mounts, and the largest) and the first idle daemon's right after its mount against after the lease cycles made since: an idle daemon's memory should not grow with the leases made elsewhere. **11a–11f** the same on the etcd binary. The tables "What each system call costs the etcd server" read each server's /metrics around 200 operations made one after another, on names at the mount's root and in a namespace (` + "`rpc-ns/NAME`" + `).
- **8** a holder process flocks one name, a successor blocks in flock on it (seen in user.lease.waiters), the holder is SIGKILLed: the time until the successor's flock returns. The holder is ` + "`flock -o NAME sh -c 'echo held; exec cat'`" + ` (util-linux flock(1), as in README's ` + "`flock -n NAME cmd`" + `; -o keeps the lock flock(1)'s own, so killing it frees the name). **8g** the same with this program as the holder, a Go process: its death takes the kernel longer (it unmaps a larger address space before closing its files). "holder dead after" is the median time from SIGKILL until the holder is a zombie (waitid WNOWAIT), its files closed: the kernel's share, before the daemon hears of the death.
`

// findRow returns the row with id and clients.
func findRow(rows []row, id string, clients int) (row, bool) {
	for _, r := range rows {
		if r.id == id && r.clients == clients {
			return r, true
		}
	}
	return row{}, false
}
