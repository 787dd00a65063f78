package integration

import (
	"bufio"
	"cmp"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
	"golang.org/x/sys/unix"
)

// This file is the checker of the reliability suite: it reads the operation
// logs that the client processes write (testdata/goclient, testdata/reliability)
// and checks the history they describe with porcupine and with direct
// invariants. Timestamps are CLOCK_MONOTONIC nanoseconds, which every client
// and the test process read from the same system-wide clock.

// expirySlack absorbs the rounding between the wall-clock heartbeat a
// restarted daemon reloads and the monotonic clock it measures expiry on
// (they differ only by clock steps). Bounds derived from expiry are moved by
// it in the direction that can only hide a violation, never invent one.
const expirySlack = 2 * time.Millisecond

// monoNow returns CLOCK_MONOTONIC in nanoseconds, the clock of the client logs.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // CLOCK_MONOTONIC always exists on Linux
	}
	return ts.Nano()
}

// histOp is one operation of one client process: B line and, unless the
// client died first, its E line.
type histOp struct {
	client  int    // client process id (see [clientInfo])
	seq     int    // per-client sequence number
	op      string // acq, renew, check or rel
	name    string // resource
	mode    string // token, or how a handle lease was taken (flock, lockf, ...)
	lease   string // the lease acted on (acq: the lease granted), "-" unknown
	gen     uint64 // its generation, 0 unknown
	call    int64  // monotonic ns before the syscall
	wall    int64  // wall-clock ns before the syscall
	ret     int64  // monotonic ns after it; 0 while pending (the client died)
	result  string // ok, an errno name, or lost-*/TIMEOUT/...; "" while pending
	token   string // acq of a token lease: the token read
	action  string // rel: complete or abandon (token), unlock or close (handle)
	seenID  string // check: the lease the status document showed
	seenGen uint64
}

// handle reports whether op concerns a handle lease (anything but token).
func (o *histOp) handle() bool { return o.mode != "token" }

// pending reports whether the client died before op returned.
func (o *histOp) pending() bool { return o.ret == 0 }

func (o *histOp) String() string {
	res := o.result
	if o.pending() {
		res = "pending"
	}
	return fmt.Sprintf("client %d #%d %s %s %s lease %s gen %d -> %s", o.client, o.seq, o.op, o.mode, o.name, o.lease, o.gen, res)
}

// clientInfo is one client process of a run.
type clientInfo struct {
	id     int
	kind   string // python, go, bash
	modes  string
	log    string
	killed int64 // monotonic ns when the chaos loop (or the end of the run) SIGKILLed it; 0 if never
}

// opHistory is everything a run did.
type opHistory struct {
	lease    time.Duration
	start    int64 // monotonic ns when the clients started
	end      int64 // monotonic ns when the last client was killed
	crashes  []int64
	clients  map[int]*clientInfo
	ops      []*histOp
	crashRun bool // the daemon was killed: operations may fail with ENOTCONN
}

// rel renders a monotonic timestamp relative to the start of the run.
func (h *opHistory) rel(ns int64) string {
	if ns == 0 {
		return "never"
	}
	return fmt.Sprintf("%.3fs", float64(ns-h.start)/1e9)
}

// parseClientLog reads the operations of client c from its log. A torn last
// line (the client was killed mid-write) is ignored.
func parseClientLog(c *clientInfo) ([]*histOp, error) {
	f, err := os.Open(c.log)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	bySeq := map[int]*histOp{}
	var ops []*histOp
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	line := 0
	for sc.Scan() {
		line++
		fs := strings.Fields(sc.Text())
		bad := func() error { return fmt.Errorf("%s:%d: malformed log line %q", c.log, line, sc.Text()) }
		switch {
		case len(fs) == 9 && fs[0] == "B":
			o := &histOp{client: c.id, op: fs[2], name: fs[3], mode: fs[4], lease: fs[5]}
			var e1, e2, e3, e4 error
			o.seq, e1 = strconv.Atoi(fs[1])
			o.gen, e2 = strconv.ParseUint(fs[6], 10, 64)
			o.call, e3 = strconv.ParseInt(fs[7], 10, 64)
			o.wall, e4 = strconv.ParseInt(fs[8], 10, 64)
			if e1 != nil || e2 != nil || e3 != nil || e4 != nil {
				return nil, bad()
			}
			bySeq[o.seq] = o
			ops = append(ops, o)
		case len(fs) == 7 && fs[0] == "E":
			seq, e1 := strconv.Atoi(fs[1])
			gen, e2 := strconv.ParseUint(fs[4], 10, 64)
			ret, e3 := strconv.ParseInt(fs[5], 10, 64)
			if e1 != nil || e2 != nil || e3 != nil {
				return nil, bad()
			}
			o := bySeq[seq]
			if o == nil {
				return nil, fmt.Errorf("%s:%d: E line for unknown operation %d", c.log, line, seq)
			}
			o.result, o.ret = fs[2], ret
			switch o.op {
			case "acq":
				o.lease, o.gen = fs[3], gen
				if fs[6] != "-" {
					o.token = fs[6]
				}
			case "check":
				o.seenID, o.seenGen = fs[3], gen
			case "rel":
				o.action = fs[6]
			}
		default:
			if !sc.Scan() { // only the last line may be torn
				return ops, nil
			}
			return nil, bad()
		}
	}
	return ops, sc.Err()
}

// load reads every client's log into h.ops, in client and sequence order.
func (h *opHistory) load() error {
	h.ops = nil
	ids := slices.Sorted(func(yield func(int) bool) {
		for id := range h.clients {
			if !yield(id) {
				return
			}
		}
	})
	for _, id := range ids {
		ops, err := parseClientLog(h.clients[id])
		if err != nil {
			return err
		}
		h.ops = append(h.ops, ops...)
	}
	return nil
}

// relViolation is one broken rule, described for the failure message.
type relViolation struct {
	rule   string
	detail string
}

// checkReport is the outcome of [opHistory.check].
type checkReport struct {
	operations   int   // completed operations checked
	acquisitions int   // successful acquisitions
	lateRenews   int   // renews of stalled holders issued after their lease must have expired
	lateRefused  int   // ... refused with ESTALE
	closest      int64 // smallest gap (ns) between a holder's end and its successor's start; -1 if none
	refusedEnded int   // leases with a refused renew found ended in `leasefs history`
	linearizable porcupine.CheckResult
	vizPath      string // porcupine visualization, written when not Ok
	results      map[string]int
	violations   []relViolation
}

func (r *checkReport) add(rule, format string, args ...any) {
	r.violations = append(r.violations, relViolation{rule, fmt.Sprintf(format, args...)})
}

// gone reports whether result means the daemon died under the operation: its
// outcome is then unknown.
func daemonGone(result string) bool {
	switch result {
	case "ENOTCONN", "ECONNABORTED", "ENODEV":
		return true
	case "DETACHED":
		// A descriptor on a mount that a restarted daemon detached (the
		// bash client sees it through /proc/PID/fd): its daemon is gone.
		return true
	}
	return false
}

// expectedResult reports whether result is documented for o (docs/PROTOCOL.md §3, §6,
// §9). In a crash run, operations may also fail because the daemon died
// (ENOTCONN) or the mountpoint was not mounted yet (ENOENT: the namespace is
// missing from the bare directory).
func (h *opHistory) expectedResult(o *histOp) bool {
	if h.crashRun {
		res := strings.TrimPrefix(o.result, "lost-")
		if daemonGone(res) || res == "ENOENT" {
			return true
		}
		if res == "EIO" && h.diedDuring(o) {
			// The kernel answers EIO to a request it was copying to or
			// from the daemon as that died (docs/PROTOCOL.md §9): seen
			// about once in 20,000 calls, within 15 ms of a SIGKILL,
			// with no refusal in the daemon's log.
			return true
		}
	}
	switch o.op {
	case "acq":
		switch o.result {
		case "ok", "EEXIST", "EWOULDBLOCK", "TIMEOUT":
			return true
		case "lost-ESTALE":
			// A holder stalled between its create and its first read finds
			// its token lease expired; the shell's flockfd then reads through
			// /dev/fd/3, which reopens the expired lease's inode, while its
			// lock acquired a new lease. Every other handle client reads
			// through the locked descriptor, which follows the lock.
			return o.mode == "token" || o.mode == "flockfd"
		case "notoken":
			// The same stall, when a successor already holds the name: the
			// bash client's read through /dev/fd/3 is a path open, which
			// shows the name's current lease (docs/PROTOCOL.md §3), so it
			// reads the successor's status document instead of a token.
			// Only a call that outlived the lease duration can see that.
			return o.mode == "token" && time.Duration(o.ret-o.call) > h.lease
		}
	case "renew":
		return o.result == "ok" || o.result == "ESTALE"
	case "check":
		return o.result == "ok"
	case "rel":
		if o.handle() {
			return o.result == "ok"
		}
		return o.result == "ok" || o.result == "ESTALE"
	}
	return false
}

// holdInterval is the time during which a client held a lease by its own
// account, bounded conservatively (see [opHistory.intervals]).
type holdInterval struct {
	acq        *histOp
	start, end int64
	why        string // what ended it
}

// dyingSlack is how long before an operation's call a daemon SIGKILL can
// still be under way: the kill is stamped before the signal is sent, and
// the process takes a moment to die.
const dyingSlack = int64(time.Second)

// diedDuring reports whether a daemon was killed while o ran: a kill
// stamped between dyingSlack before o's call and its return.
func (h *opHistory) diedDuring(o *histOp) bool {
	for _, k := range h.crashes {
		if k >= o.call-dyingSlack && o.ret != 0 && k <= o.ret {
			return true
		}
	}
	return false
}

// nextCrash returns the first daemon kill at or after ns, or 0.
func (h *opHistory) nextCrash(ns int64) int64 {
	for _, k := range h.crashes {
		if k >= ns {
			return k
		}
	}
	return 0
}

// intervals derives the holder intervals of every successful acquisition:
// from the moment the acquire returned to
//   - handle leases: the first of the release call, the SIGKILL of the client
//     and the first SIGKILL of the daemon after the acquire was called
//     (handle leases die with either);
//   - token leases: the first of the release call and the start of the last
//     successful renew (or of the acquire) plus the lease duration: the daemon
//     sets the heartbeat after that start, so the lease lives at least that
//     long whatever happens to its holder.
//
// Every bound errs towards a shorter interval, so an overlap is a real one.
func (h *opHistory) intervals() map[string][]holdInterval {
	type key struct {
		client int
		lease  string
	}
	byLease := map[key][]*histOp{}
	for _, o := range h.ops {
		byLease[key{o.client, o.lease}] = append(byLease[key{o.client, o.lease}], o)
	}
	out := map[string][]holdInterval{}
	for _, o := range h.ops {
		if o.op != "acq" || o.result != "ok" {
			continue
		}
		iv := holdInterval{acq: o, start: o.ret, end: h.end, why: "end of run"}
		cut := func(t int64, why string) {
			if t != 0 && t < iv.end {
				iv.end, iv.why = t, why
			}
		}
		later := byLease[key{o.client, o.lease}]
		if o.handle() {
			cut(h.clients[o.client].killed, "client killed")
			// A crash while the acquire was under way (its return stamp is
			// taken after the last syscall) may have come after the grant:
			// the lease died with that daemon, so the interval is empty.
			cut(h.nextCrash(o.call), "daemon killed")
			for _, x := range later {
				if x.seq > o.seq && x.op == "rel" {
					cut(x.call, "release called")
					break
				}
			}
		} else {
			lastStart := o.call
			for _, x := range later {
				if x.seq <= o.seq {
					continue
				}
				if x.op == "rel" {
					cut(x.call, "release called")
					break
				}
				if x.op == "renew" && x.result == "ok" {
					lastStart = x.call
				}
			}
			cut(lastStart+int64(h.lease-expirySlack), "expired")
		}
		if iv.end > iv.start {
			out[o.name] = append(out[o.name], iv)
		}
	}
	return out
}

// check runs every check on the loaded history.
func (h *opHistory) check(vizDir string) *checkReport {
	r := &checkReport{results: map[string]int{}, closest: -1}
	for _, o := range h.ops {
		if o.pending() {
			continue
		}
		r.operations++
		r.results[o.op+" "+o.mode+" "+o.result]++
		if o.op == "acq" && o.result == "ok" {
			r.acquisitions++
		}
		if !h.expectedResult(o) {
			r.add("unexpected result", "%s at %s", o, h.rel(o.ret))
		}
	}
	h.checkOverlap(r)
	h.checkGenerations(r)
	h.checkRenewals(r)
	h.checkLinearizable(r, vizDir)
	return r
}

// checkOverlap: no two holders of one name overlap.
func (h *opHistory) checkOverlap(r *checkReport) {
	for name, ivs := range h.intervals() {
		slices.SortFunc(ivs, func(a, b holdInterval) int { return cmp.Compare(a.start, b.start) })
		var widest *holdInterval
		for i := range ivs {
			iv := &ivs[i]
			if widest != nil && iv.start >= widest.end && (r.closest < 0 || iv.start-widest.end < r.closest) {
				r.closest = iv.start - widest.end
			}
			if widest != nil && iv.start < widest.end {
				r.add("two holders", "%s: %s held [%s, %s] (ended by: %s) while %s held from %s (overlap %v)",
					name, widest.acq, h.rel(widest.start), h.rel(widest.end), widest.why,
					iv.acq, h.rel(iv.start), time.Duration(widest.end-iv.start))
			}
			if widest == nil || iv.end > widest.end {
				widest = iv
			}
		}
	}
}

// checkGenerations: every lease is granted once, with its own generation, and
// an acquire that starts after another returned gets a larger generation, on
// any name (docs/PROTOCOL.md §1: strictly increasing across all leases of a store).
func (h *opHistory) checkGenerations(r *checkReport) {
	var acqs []*histOp
	byLease := map[string]*histOp{}
	byGen := map[uint64]*histOp{}
	for _, o := range h.ops {
		if o.op != "acq" || o.result != "ok" || o.gen == 0 {
			continue
		}
		acqs = append(acqs, o)
		if prev := byLease[o.lease]; prev != nil {
			r.add("lease granted twice", "%s and %s", prev, o)
		}
		if prev := byGen[o.gen]; prev != nil && prev.lease != o.lease {
			r.add("generation reused", "%s and %s", prev, o)
		}
		byLease[o.lease], byGen[o.gen] = o, o
	}
	byRet := slices.Clone(acqs)
	slices.SortFunc(byRet, func(a, b *histOp) int { return cmp.Compare(a.ret, b.ret) })
	slices.SortFunc(acqs, func(a, b *histOp) int { return cmp.Compare(a.call, b.call) })
	var top *histOp // the largest generation among acquires returned so far
	i := 0
	for _, b := range acqs {
		for ; i < len(byRet) && byRet[i].ret < b.call; i++ {
			if top == nil || byRet[i].gen > top.gen {
				top = byRet[i]
			}
		}
		if top != nil && top.gen >= b.gen {
			r.add("generation not increasing", "%s returned at %s, before %s was called at %s",
				top, h.rel(top.ret), b, h.rel(b.call))
		}
	}
}

// checkRenewals: a stalled holder's late renew is refused with ESTALE and never
// resurrects its lease; a released, refused or expired lease is never renewed
// (nor released) successfully.
func (h *opHistory) checkRenewals(r *checkReport) {
	type state struct {
		lastOK   int64 // return of the acquire or last successful renew
		released *histOp
		refused  *histOp
	}
	leases := map[string]*state{}
	for _, o := range h.ops { // client and sequence order
		if o.mode != "token" || o.lease == "-" || o.pending() {
			continue
		}
		k := fmt.Sprint(o.client, " ", o.lease)
		if o.op == "acq" {
			if o.result == "ok" {
				leases[k] = &state{lastOK: o.ret}
			}
			continue
		}
		st := leases[k]
		if st == nil {
			continue
		}
		if o.result == "ok" {
			switch {
			case st.released != nil:
				r.add("released lease renewed", "%s after %s", o, st.released)
			case st.refused != nil:
				r.add("refused lease resurrected", "%s succeeded after %s was refused", o, st.refused)
			}
		}
		if o.op == "renew" && !daemonGone(o.result) && o.call > st.lastOK+int64(h.lease+expirySlack) {
			r.lateRenews++
			if o.result == "ESTALE" {
				r.lateRefused++
			}
			if o.result == "ok" {
				r.add("expired lease renewed", "%s called at %s, %v after its lease expired at %s at the latest",
					o, h.rel(o.call), time.Duration(o.call-st.lastOK-int64(h.lease)), h.rel(st.lastOK+int64(h.lease)))
			}
		}
		switch {
		case o.result == "ok" && o.op == "renew":
			st.lastOK = o.ret
		case o.result == "ok" && o.op == "rel":
			st.released = o
		case o.result == "ESTALE" && st.refused == nil:
			st.refused = o
		}
	}
}

// describe renders the violations for a failure message, at most max of them.
func (r *checkReport) describe(max int) string {
	var b strings.Builder
	for i, v := range r.violations {
		if i == max {
			fmt.Fprintf(&b, "... and %d more\n", len(r.violations)-max)
			break
		}
		fmt.Fprintf(&b, "%s: %s\n", v.rule, v.detail)
	}
	return b.String()
}
