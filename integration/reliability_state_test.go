package integration

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// This file inspects the state directory of the crash torture
// (TestReliabilityDaemonCrash) black-box: the record files as the reference
// store's field names describe them (docs/PROTOCOL.md §4.3), and `leasefs ls`/`history`.

// stateRecord is the part of a record file the checks read.
type stateRecord struct {
	LeaseID     string `toml:"lease_id"`
	Thread      string `toml:"thread"`
	TokenHash   string `toml:"token_hash"`
	HeartbeatAt string `toml:"heartbeat_at"`
	StartedAt   string `toml:"started_at"`
	Status      string `toml:"status"`
	CompletedAt string `toml:"completed_at"`
	Generation  uint64 `toml:"generation"`
	Mode        string `toml:"mode"`
}

// fileStamp identifies one version of a file: a record is replaced by rename,
// so a new version has a new inode.
type fileStamp struct {
	ino, size uint64
	mtime     int64
}

// stateChecker accumulates what the crash torture verified and violated.
type stateChecker struct {
	state, ns  string
	files      map[string]fileStamp    // record path → version parsed last
	records    map[string]*stateRecord // lease id → record as last parsed
	candidates map[string]bool         // every base32 string of 39 chars seen in the state directory
	verifiedOp map[[2]int]bool         // client, seq of the operations verified

	verified   int // acknowledged changes found durable after a crash
	parsed     int // record file versions parsed
	tempSeen   int // temporary files left behind by crashes
	heartbeats int // token leases whose heartbeat was compared across a restart
	violations []relViolation
}

func newStateChecker(state, ns string) *stateChecker {
	return &stateChecker{state: state, ns: ns, files: map[string]fileStamp{}, records: map[string]*stateRecord{},
		candidates: map[string]bool{}, verifiedOp: map[[2]int]bool{}}
}

func (sc *stateChecker) add(rule, format string, args ...any) {
	sc.violations = append(sc.violations, relViolation{rule, fmt.Sprintf(format, args...)})
}

func (sc *stateChecker) describe(max int) string {
	r := checkReport{violations: sc.violations}
	return r.describe(max)
}

var tokenHashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// maxSpareFiles bounds the spare files of a state directory: the 1,024
// freed files and 256 ready ones a daemon keeps, and the 256 ready ones it
// adopted at its start (docs/PROTOCOL.md §4.3).
const maxSpareFiles = 1024 + 2*256

// stateDirFiles are the files a state directory may hold besides records.
var stateDirFiles = map[string]bool{"writer-leases": true, "generation": true, "namespaces.toml": true, "leasefs.lock": true, "leasefs.lock.json": true,
	"lease-duration": true, "waiters.toml": true, "journal.0": true, "journal.1": true, "records.cache": true, "mounts.json": true}

// scan inspects the state directory while no daemon runs: every record
// version not seen before must parse and be well formed, no file may contain
// a token, and files that are neither records nor the store's own files are
// temporary files a crash left behind; scan returns their paths.
func (sc *stateChecker) scan(tokens map[string]bool) []string {
	return sc.walk(tokens, false)
}

// scanServed is scan while a daemon serves the state directory. It holds the
// shared store lock (writer-leases/.lock), as every reader of the records
// does (docs/PROTOCOL.md §4.3), so that no record is exchanged or its old
// file reused while it reads; files the daemon adds or removes beside the
// records meanwhile (its spares, its own pending files) are neither
// leftovers nor errors.
func (sc *stateChecker) scanServed(tokens map[string]bool) {
	lock, err := os.Open(filepath.Join(sc.state, relLeasesDir, ".lock"))
	if err != nil {
		sc.add("state directory unreadable", "%v", err)
		return
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_SH); err != nil {
		sc.add("store lock", "flock LOCK_SH: %v", err)
		return
	}
	sc.walk(tokens, true)
}

func (sc *stateChecker) walk(tokens map[string]bool, served bool) []string {
	var leftovers []string
	seen := map[string]bool{}
	spares := 0
	gone := func(err error) bool { return served && errors.Is(err, fs.ErrNotExist) }
	err := filepath.WalkDir(sc.state, func(path string, de fs.DirEntry, err error) error {
		if gone(err) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(sc.state, path)
		dir, name := filepath.Split(rel)
		if de.IsDir() {
			if rel != "." && rel != relLeasesDir {
				sc.add("unexpected directory", "%s", path)
			}
			return nil
		}
		isRecord := dir == relLeasesDir+"/" && strings.HasPrefix(name, "lease-") && strings.HasSuffix(name, ".toml")
		switch {
		case isRecord:
		case dir == relLeasesDir+"/" && name == ".lock":
		case dir == "" && stateDirFiles[name]:
		case dir == relLeasesDir+"/" && strings.HasPrefix(name, ".free-"):
			// A spare file (docs/PROTOCOL.md §4.3): the next daemon keeps
			// up to 256 and removes the rest, so their number stays
			// bounded; they must be plain files like any other.
			spares++
			if !de.Type().IsRegular() {
				sc.add("spare file not a regular file", "%s: %v", path, de.Type())
			}
		case served:
			// The daemon's own pending file (generation, namespaces,
			// record cache), not a crash's leftover.
		default:
			leftovers = append(leftovers, path)
			sc.tempSeen++
		}
		info, err := de.Info()
		if gone(err) {
			return nil
		}
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		stamp := fileStamp{ino: st.Ino, size: uint64(st.Size), mtime: st.Mtim.Nano()}
		if isRecord {
			seen[path] = true
			if sc.files[path] == stamp {
				return nil
			}
			sc.files[path] = stamp
		}
		data, err := os.ReadFile(path)
		if gone(err) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, m := range tokenBodyRE.FindAllString(string(data), -1) {
			sc.candidates[m] = true
		}
		if hits := findTokens(string(data), tokens); len(hits) > 0 {
			sc.add("token stored", "%s contains %s…", path, hits[0][:8])
		}
		switch {
		case isRecord:
			sc.parseRecord(path, name, data)
		case dir == "" && strings.HasSuffix(name, ".toml"):
			var v map[string]any
			if _, err := toml.Decode(string(data), &v); err != nil {
				sc.add("half-written state file", "%s does not parse: %v\n%s", path, err, data)
			}
		}
		return nil
	})
	if err != nil {
		sc.add("state directory unreadable", "%v", err)
	}
	// A daemon keeps at most 1,024 freed files and 256 ready ones; a crash
	// leaves what it had, and the next start keeps at most 256 of those.
	if spares > maxSpareFiles {
		sc.add("spare files pile up", "%d spare files in %s, want at most %d", spares, relLeasesDir, maxSpareFiles)
	}
	for p := range sc.files {
		if !seen[p] {
			delete(sc.files, p)
		}
	}
	return leftovers
}

// plantTempFile imitates a crash in the middle of a record write: it puts
// half of an existing record into a pending file named as the daemon's
// atomic writes name theirs (".<record name><digits>" beside the record), and
// returns its path ("" when there is no record yet). The next daemon must
// remove it and keep the record as it was.
func (sc *stateChecker) plantTempFile() string {
	recs, _ := filepath.Glob(filepath.Join(sc.state, relLeasesDir, "lease-*.toml"))
	if len(recs) == 0 {
		return ""
	}
	src := recs[len(recs)/2]
	data, err := os.ReadFile(src)
	if err != nil {
		sc.add("state directory unreadable", "%v", err)
		return ""
	}
	p := filepath.Join(filepath.Dir(src), "."+filepath.Base(src)+fmt.Sprint(time.Now().UnixNano()%1e9))
	if err := os.WriteFile(p, data[:len(data)/2], 0o600); err != nil {
		sc.add("state directory unwritable", "%v", err)
		return ""
	}
	return p
}

// plantTornJournal imitates a crash in the middle of a journal write: after
// the last valid entry of the active journal (the one with the higher epoch;
// docs/PROTOCOL.md §4.3 gives the format) it writes the first half of an
// entry. It returns whether it planted one. The next daemon must drop it,
// say so in its log, and lose no acknowledged change.
func (sc *stateChecker) plantTornJournal() bool {
	var best string
	var bestEpoch uint64
	var bestEnd int
	for _, name := range []string{"journal.0", "journal.1"} {
		p := filepath.Join(sc.state, name)
		data, err := os.ReadFile(p)
		if err != nil || len(data) < 32 || string(data[:16]) != "LEASEFS-JOURNAL\n" ||
			crc32.Checksum(data[:28], crc32c) != binary.LittleEndian.Uint32(data[28:]) {
			continue
		}
		epoch := binary.LittleEndian.Uint64(data[20:])
		if best != "" && epoch < bestEpoch {
			continue
		}
		end := 32
		for end+8 <= len(data) {
			n := int(binary.LittleEndian.Uint32(data[end:]))
			if n == 0 || end+8+n > len(data) {
				break
			}
			var e [8]byte
			binary.LittleEndian.PutUint64(e[:], epoch)
			sum := crc32.Update(crc32.Checksum(e[:], crc32c), crc32c, data[end+8:end+8+n])
			if sum != binary.LittleEndian.Uint32(data[end+4:]) {
				break
			}
			end += 8 + n
		}
		best, bestEpoch, bestEnd = p, epoch, end
	}
	if best == "" {
		return false
	}
	f, err := os.OpenFile(best, os.O_WRONLY, 0)
	if err != nil {
		sc.add("state directory unwritable", "%v", err)
		return false
	}
	defer f.Close()
	torn := make([]byte, 8, 8+40)
	binary.LittleEndian.PutUint32(torn, 400) // promises 400 bytes, writes 40
	binary.LittleEndian.PutUint32(torn[4:], 0xdeadbeef)
	torn = append(torn, "Rlease_id = \"lease-torn\"\nthread = \"mx/"...)
	if _, err := f.WriteAt(torn, int64(bestEnd)); err != nil {
		sc.add("state directory unwritable", "%v", err)
		return false
	}
	return true
}

// crc32c is the CRC-32C table of the journal's checksums.
var crc32c = crc32.MakeTable(crc32.Castagnoli)

// relLeasesDir is the records directory of a state directory (docs/PROTOCOL.md §4.3).
const relLeasesDir = "writer-leases"

// parseRecord checks one record version and remembers it.
func (sc *stateChecker) parseRecord(path, name string, data []byte) {
	sc.parsed++
	var r stateRecord
	if _, err := toml.Decode(string(data), &r); err != nil {
		sc.add("half-written record", "%s does not parse: %v\n%s", path, err, data)
		return
	}
	var problems []string
	if r.LeaseID+".toml" != name {
		problems = append(problems, "lease_id does not match the file name")
	}
	if !strings.HasPrefix(r.Thread, sc.ns+"/") {
		problems = append(problems, "thread outside the namespace")
	}
	if !tokenHashRE.MatchString(r.TokenHash) {
		problems = append(problems, "token_hash is not a blake3 hex digest")
	}
	for k, v := range map[string]string{"heartbeat_at": r.HeartbeatAt, "started_at": r.StartedAt} {
		if _, err := time.Parse(time.RFC3339Nano, v); err != nil {
			problems = append(problems, k+" is not an RFC 3339 time")
		}
	}
	switch r.Status {
	case "active":
		if r.CompletedAt != "" {
			problems = append(problems, "active with completed_at")
		}
	case "complete", "abandoned":
		if _, err := time.Parse(time.RFC3339Nano, r.CompletedAt); err != nil {
			problems = append(problems, "ended without a valid completed_at")
		}
	default:
		problems = append(problems, "unknown status")
	}
	if r.Generation == 0 {
		problems = append(problems, "no generation")
	}
	if r.Mode != "token" && r.Mode != "handle" {
		problems = append(problems, "unknown mode")
	}
	if len(problems) > 0 {
		sc.add("malformed record", "%s: %s\n%s", path, strings.Join(problems, "; "), data)
	}
	sc.records[r.LeaseID] = &r
}

// recordTimeOf parses a time of a record (zero when malformed).
func recordTimeOf(s string) time.Time {
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

// releaseStatus is the status a release action leaves.
func releaseStatus(action string) string {
	switch action {
	case "complete", "unlock":
		return "complete"
	case "abandon":
		return "abandoned"
	}
	return ""
}

// verifyAcknowledged checks, against the records a crashed daemon left (read
// by the last [stateChecker.scan]), every change that a syscall acknowledged
// before the crash and that no earlier crash verified: a reserved lease has
// its record with its generation (and mode handle once a lock returned), a
// renew moved heartbeat_at at least to when it was called, a release
// (complete, abandon, or a synchronous unlock of a handle lease) ended it with
// that status.
func (sc *stateChecker) verifyAcknowledged(h *opHistory, kill int64, crash int) {
	for _, o := range h.ops {
		key := [2]int{o.client, o.seq}
		if o.pending() || o.ret >= kill || o.result != "ok" || sc.verifiedOp[key] || o.lease == "-" {
			continue
		}
		if o.op == "check" || (o.op == "rel" && releaseStatus(o.action) == "") || (o.op == "acq" && o.gen == 0) {
			continue
		}
		sc.verifiedOp[key] = true
		sc.verified++
		rec := sc.records[o.lease]
		if rec == nil {
			sc.add("acknowledged change lost", "crash %d: no record of lease %s after %s", crash, o.lease, o)
			continue
		}
		called := time.Unix(0, o.wall)
		switch o.op {
		case "acq":
			wantMode := "token"
			if o.handle() {
				wantMode = "handle"
			}
			if rec.Generation != o.gen || rec.Thread != sc.ns+"/"+o.name || rec.Mode != wantMode {
				sc.add("acknowledged reserve lost", "crash %d: %s, but the record says thread %s generation %d mode %s%s",
					crash, o, rec.Thread, rec.Generation, rec.Mode, sc.fileNow(o.lease))
			}
		case "renew":
			if hb := recordTimeOf(rec.HeartbeatAt); hb.Before(called) {
				sc.add("acknowledged renew lost", "crash %d: %s called at %s, but heartbeat_at = %s%s",
					crash, o, called.UTC().Format(time.RFC3339Nano), rec.HeartbeatAt, sc.fileNow(o.lease))
			}
		case "rel":
			if rec.Status != releaseStatus(o.action) || recordTimeOf(rec.CompletedAt).Before(called) {
				sc.add("acknowledged release lost", "crash %d: %s (%s) called at %s, but the record says status %s completed_at %s%s",
					crash, o, o.action, called.UTC().Format(time.RFC3339Nano), rec.Status, rec.CompletedAt, sc.fileNow(o.lease))
			}
		}
	}
}

// fileNow describes the record file of lease id as it is now, beside the
// version the checker parsed last, for a violation's message.
func (sc *stateChecker) fileNow(id string) string {
	path := filepath.Join(sc.state, relLeasesDir, id+".toml")
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return fmt.Sprintf("\n  record file now: %v", err)
	}
	data, _ := os.ReadFile(path)
	return fmt.Sprintf("\n  record file now: ino %d size %d mtime %d (parsed last: %+v):\n%s",
		st.Ino, st.Size, st.Mtim.Nano(), sc.files[path], data)
}

// restartSnapshot is `leasefs ls --json` just before and just after one
// restart.
type restartSnapshot struct {
	kill     int64     // monotonic ns of the SIGKILL
	wallKill time.Time // wall clock of the SIGKILL
	listed   int64     // monotonic ns once "after" was listed
	before   []map[string]any
	after    []map[string]any
}

// lsStateJSON runs `leasefs ls --state STATE --json`.
func lsStateJSON(t testing.TB, state string) []map[string]any {
	t.Helper()
	return cliJSON(t, "ls", "--state", state, "--json")
}

// finalChecks runs the checks that need the complete logs: heartbeats across
// every restart, every acknowledged change in `ls`/`history` at the end, no
// token in any daemon log or state file ever seen.
func (sc *stateChecker) finalChecks(t *testing.T, h *opHistory, tokens map[string]bool, restarts []restartSnapshot, stderrs []string) {
	t.Helper()
	renews := map[string][]*histOp{}
	for _, o := range h.ops {
		if o.op == "renew" && o.result == "ok" {
			renews[o.lease] = append(renews[o.lease], o)
		}
	}
	for i, rs := range restarts {
		before := map[string]map[string]any{}
		for _, e := range rs.before {
			before[fmt.Sprint(e["lease_id"])] = e
		}
		for _, e := range rs.after {
			id := fmt.Sprint(e["lease_id"])
			b, ok := before[id]
			if !ok {
				if started := recordTimeOf(fmt.Sprint(e["started_at"])); started.Before(rs.wallKill) {
					sc.add("lease revived by a restart", "restart %d: %s (%s, generation %v) started at %s, before the crash, is live after the restart but was not live at the crash",
						i+1, id, e["resource"], e["generation"], started.UTC().Format(time.RFC3339Nano))
				}
				continue
			}
			if fmt.Sprint(e["mode"]) != "token" {
				continue
			}
			sc.heartbeats++
			hbBefore, hbAfter := fmt.Sprint(b["heartbeat_at"]), fmt.Sprint(e["heartbeat_at"])
			if hbBefore == hbAfter {
				if fmt.Sprint(b["expires_at"]) != fmt.Sprint(e["expires_at"]) {
					sc.add("expiry changed by a restart", "restart %d: %s expires_at %v before, %v after", i+1, id, b["expires_at"], e["expires_at"])
				}
				continue
			}
			renewed := false
			for _, o := range renews[id] {
				if o.call > rs.kill && o.call <= rs.listed {
					renewed = true
				}
			}
			if !renewed || recordTimeOf(hbAfter).Before(recordTimeOf(hbBefore)) {
				sc.add("heartbeat changed by a restart", "restart %d: %s (%s) heartbeat_at %s at the crash, %s after the restart, with no renew in between",
					i+1, id, e["resource"], hbBefore, hbAfter)
			}
		}
	}

	live := lsStateJSON(t, sc.state)
	ended := cliJSON(t, "history", "--state", sc.state, "--json")
	listed := map[string]map[string]any{}
	for _, e := range append(live, ended...) {
		listed[fmt.Sprint(e["lease_id"])] = e
	}
	for _, o := range h.ops {
		if o.pending() || o.result != "ok" || o.lease == "-" {
			continue
		}
		switch {
		case o.op == "acq" && o.gen != 0:
			e := listed[o.lease]
			if e == nil || fmt.Sprint(e["generation"]) != fmt.Sprint(o.gen) || fmt.Sprint(e["resource"]) != sc.ns+"/"+o.name {
				sc.add("acknowledged reserve missing from ls/history", "%s: listed as %v", o, e)
			}
		case o.op == "rel" && releaseStatus(o.action) != "":
			e := listed[o.lease]
			if e == nil || fmt.Sprint(e["status"]) != releaseStatus(o.action) {
				sc.add("acknowledged release missing from history", "%s (%s): listed as %v", o, o.action, e)
			}
		}
	}
	for i, s := range stderrs {
		for _, p := range daemonProblems(s) {
			sc.add("daemon log", "daemon %d: %s", i+1, p)
		}
		if hits := findTokens(s, tokens); len(hits) > 0 {
			sc.add("token in daemon log", "daemon %d: %d tokens, e.g. %s…", i+1, len(hits), hits[0][:8])
		}
	}
	for m := range sc.candidates {
		if tokens["hwl_"+m] {
			sc.add("token stored", "the state directory held the token %s…", ("hwl_" + m)[:8])
		}
	}
}
