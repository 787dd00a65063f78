package mount

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/renameio/v2"

	"github.com/leasefs/leasefs/fusefs"
	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/internal/openfiles"
	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/leasecore"
)

// MountsRecordName is the file in the state directory that names the
// mounts through which handle leases may still be held: this daemon's and
// those of previous daemons whose open files outlived them
// (docs/PROTOCOL.md §2, "Handle leases across restarts"; §4.3).
const MountsRecordName = "mounts.json"

// maxRecordedMounts bounds the mounts kept in the record.
const maxRecordedMounts = 64

// mountsRecord is the content of [MountsRecordName].
type mountsRecord struct {
	// BootID is the boot the mounts belong to: after a reboot none of
	// them exists.
	BootID string `json:"boot_id"`
	// Mounts are mount ids (the first field of /proc/self/mountinfo, the
	// mnt_id of /proc/PID/fdinfo), newest first.
	Mounts []int `json:"mounts"`
	// UpdatedAt is when the record was written (wall clock).
	UpdatedAt time.Time `json:"updated_at"`
}

// readMountsRecord returns the mounts recorded in state for this boot.
func readMountsRecord(state string) []int {
	b, err := os.ReadFile(filepath.Join(state, MountsRecordName))
	if err != nil || len(b) > 64<<10 {
		return nil
	}
	var r mountsRecord
	if json.Unmarshal(b, &r) != nil || r.BootID != procfs.BootID() {
		return nil
	}
	return r.Mounts
}

// writeMountsRecord replaces the record in state with mounts, durably.
func writeMountsRecord(state string, mounts []int) error {
	if len(mounts) > maxRecordedMounts {
		mounts = mounts[:maxRecordedMounts]
	}
	// A write that a crash cut short leaves a temporary file beside it.
	leftovers, _ := filepath.Glob(filepath.Join(state, "."+MountsRecordName+"*"))
	for _, p := range leftovers {
		_ = os.Remove(p)
	}
	b, err := json.MarshalIndent(mountsRecord{BootID: procfs.BootID(), Mounts: mounts, UpdatedAt: time.Now().UTC()}, "", "  ")
	if err != nil {
		return err
	}
	return renameio.WriteFile(filepath.Join(state, MountsRecordName), append(b, '\n'), 0o600)
}

// survivorScan finds the handle leases of previous daemons that a process
// still holds (docs/PROTOCOL.md §2, "Handle leases across restarts"). It is
// made before the store opens, which asks [survivorScan.holders] about each
// such lease, and the mount then hands the kept ones to the filesystem.
// Not safe for concurrent use: the store calls it during its open only.
type survivorScan struct {
	mounts []int             // previous mounts that still exist (detached)
	scan   openfiles.Scan    // their open files
	kept   []fusefs.Survivor // leases the store was told to keep
	log    *slog.Logger
	failed string // why holders cannot be checked at all; "" when they can
}

// scanSurvivors reads the mounts recorded in state (an absolute path) and
// looks for their open files in every process, leaving out the mount
// exclude (0: none). A recorded mount id that names an attached mount of
// another kind or source now was reused by another mount (the old one is
// gone) and is dropped.
// allowOther says whether other users may use the mount: without it, and
// not root, a process of another uid can hold none of its files.
func scanSurvivors(state string, allowOther bool, log *slog.Logger, exclude int) *survivorScan {
	ss := &survivorScan{log: log}
	// An attached mount with a recorded id is ours only if it is a leasefs
	// mount of this state directory (a dead daemon's, not yet detached).
	reused := make(map[int]bool)
	for _, m := range procfs.Mounts() {
		reused[m.ID] = m.FSType != fsType || m.Source != state
	}
	for _, id := range readMountsRecord(state) {
		if id > 0 && id != exclude && !reused[id] && !slices.Contains(ss.mounts, id) {
			ss.mounts = append(ss.mounts, id)
		}
	}
	if len(ss.mounts) == 0 {
		return ss
	}
	uid := os.Geteuid()
	var skip func(int) bool
	if uid != 0 && !allowOther {
		skip = func(owner int) bool { return owner != uid }
	}
	sc, err := openfiles.ScanMounts("/proc", ss.mounts, skip)
	switch {
	case errors.Is(err, openfiles.ErrNestedPIDNamespace):
		ss.failed = "this daemon runs in a nested pid namespace: processes outside it cannot be checked"
	case err != nil:
		ss.failed = err.Error()
	case len(sc.Unreadable) > 0:
		log.Warn("cannot read the open files of some processes: a handle lease of a previous daemon that only they hold is ended",
			"processes", len(sc.Unreadable), "pids", describePIDs("/proc", sc.Unreadable))
	}
	ss.scan = sc
	return ss
}

// maxNamedPIDs is how many processes [describePIDs] names.
const maxNamedPIDs = 10

// describePIDs names processes pids for the log: "1 (init), 4242 (sshd)",
// the first [maxNamedPIDs] of them, then how many more.
func describePIDs(proc string, pids []int) string {
	var b strings.Builder
	for i, pid := range pids {
		if i == maxNamedPIDs {
			fmt.Fprintf(&b, " and %d more", len(pids)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(pid))
		if c := openfiles.Comm(proc, pid); c != "" {
			fmt.Fprintf(&b, " (%s)", c)
		}
	}
	return b.String()
}

// holders is [leasecore.Options.HandleHolders]: the processes holding the
// open file of handle lease l through one of the previous mounts.
func (ss *survivorScan) holders(l leasecore.Lease) []int {
	if ss.failed != "" {
		ss.log.Warn("ending a handle lease of a previous daemon whose holders cannot be checked",
			"resource", l.Resource, "lease", l.ID, "reason", ss.failed)
		return nil
	}
	for _, m := range ss.mounts {
		k := fusefs.OpenFileOf(m, l)
		if pids := ss.scan.Holders[k]; len(pids) > 0 {
			ss.kept = append(ss.kept, fusefs.Survivor{Lease: l.ID, File: k, PIDs: pids})
			return pids
		}
	}
	return nil
}

// record writes the mounts record for this daemon's mount own: it first,
// then the previous mounts that still hold kept leases.
func (ss *survivorScan) record(state string, own int) error {
	mounts := []int{own}
	for _, s := range ss.kept {
		if !slices.Contains(mounts, s.File.Mount) {
			mounts = append(mounts, s.File.Mount)
		}
	}
	return writeMountsRecord(state, mounts)
}

// HandleHolders returns, for a reader of the state directory state (the
// "ls", "history" and "status" commands), the processes still holding the
// open file of a handle lease locked through a previous daemon's mount
// (docs/PROTOCOL.md §2, "Handle leases across restarts"): the value of
// [leasecore.Options.HandleHolders] for a read-only store. The serving
// daemon's own mount, recorded first, is left out. It scans
// /proc once, when called; processes it cannot read are left out.
func HandleHolders(state string) func(leasecore.Lease) []int {
	abs, err := filepath.Abs(state)
	if err != nil {
		return nil
	}
	exclude := 0 // the serving daemon's own mount, recorded first
	if held, ok := daemonlock.Held(filepath.Join(abs, DaemonLockName)); !ok || held {
		if rec := readMountsRecord(abs); len(rec) > 0 {
			exclude = rec[0]
		}
	}
	ss := scanSurvivors(abs, true, slog.New(slog.DiscardHandler), exclude)
	if ss.failed != "" || len(ss.mounts) == 0 {
		return nil
	}
	return func(l leasecore.Lease) []int {
		for _, m := range ss.mounts {
			if pids := ss.scan.Holders[fusefs.OpenFileOf(m, l)]; len(pids) > 0 {
				return pids
			}
		}
		return nil
	}
}
