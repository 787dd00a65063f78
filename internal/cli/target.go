package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/mount"
)

// leasefsFSType is the filesystem type of leasefs mounts in
// /proc/self/mountinfo.
const leasefsFSType = "fuse.leasefs"

// Where a [daemonTarget] came from, in the order of precedence of
// docs/PROTOCOL.md §8, "Which daemon": flags, then the environment, then
// the one daemon running.
const (
	fromStateFlag = "given with --state"
	fromMountFlag = "the source of --mount"
	fromStateEnv  = "named by $LEASEFS_STATE"
	fromMountEnv  = "the source of $LEASEFS_MOUNT"
	fromMountUp   = "the source of the one leasefs mount up"
	fromStoreUp   = "the source of the leasefs mount up serving --store"
	fromDefault   = "the default state directory (no leasefs mount is up)"
)

// targetHelp is the paragraph of "ls", "history" and "status" that says
// which store they read (docs/PROTOCOL.md §8, "Which daemon").
const targetHelp = `The store is the one of --state DIR, or of the daemon serving --mount DIR;
else of $LEASEFS_STATE, or of the daemon serving $LEASEFS_MOUNT (with both
set, $LEASEFS_STATE, and a leasefs mount on $LEASEFS_MOUNT must serve it);
else of the one leasefs mount that is up; else of the default state
directory. With several leasefs mounts up and none named, it lists them
and exits 2. The store is the one the daemon's lock records, an etcd store
included (read with the --etcd-* flags and $LEASEFS_ETCD_PASSWORD, as for
mount); --store names another.`

// daemonTarget is the state directory a command reads, and the daemon
// serving it if one does, as [pickTarget] chose it. A plain value.
type daemonTarget struct {
	// State is the state directory, absolute.
	State string
	// Mountpoint is where its daemon serves it: the daemon's record, or
	// the mount --mount named; "" when unknown.
	Mountpoint string
	// Served is set when a process holds the state's daemon lock.
	Served bool
	// Holder is the daemon's record beside its lock; zero when unknown or
	// not served.
	Holder daemonlock.Holder
	// From says how the target was chosen, in words: one of the from…
	// constants.
	From string
}

// describe returns the target of state directory state (made absolute),
// chosen as from: whether a daemon serves it, and its record.
func describe(state, from string) (daemonTarget, error) {
	abs, err := filepath.Abs(state)
	if err != nil {
		return daemonTarget{}, err
	}
	t := daemonTarget{State: abs, From: from}
	lock := filepath.Join(abs, mount.DaemonLockName)
	if held, ok := daemonlock.Held(lock); ok && held {
		t.Served = true
		if h, ok := daemonlock.ReadHolder(lock); ok {
			t.Holder, t.Mountpoint = h, h.Mountpoint
		}
	}
	return t, nil
}

// upMount is a leasefs mount whose daemon is up (see [upMounts]).
type upMount struct {
	point, state string
	holder       daemonlock.Holder
}

// String renders m for the list of a usage error: its mountpoint, state
// directory and a store other than the file store.
func (m upMount) String() string {
	s := m.point + "  (state " + m.state
	if m.holder.Store != "" {
		s += ", store " + m.holder.Store
	}
	return s + ")"
}

// upMounts returns the leasefs mounts of mounts whose daemon is up, one per
// state directory (a mount's source is its state directory), in mount order.
// A state directory whose daemon lock is not held belongs to a stale mount
// (its daemon died) and is left out; one whose lock cannot be checked (the
// state directory is another user's) counts as up. Its mountpoint is the
// one the daemon recorded when that is among its mounts, else its last.
func upMounts(mounts []procfs.MountInfo) []upMount {
	var out []upMount
	index := map[string]int{} // state directory -> index in out, -1 when not up
	for _, m := range mounts {
		if m.FSType != leasefsFSType || !filepath.IsAbs(m.Source) {
			continue
		}
		i, seen := index[m.Source]
		switch {
		case !seen:
			lock := filepath.Join(m.Source, mount.DaemonLockName)
			held, ok := daemonlock.Held(lock)
			if ok && !held {
				index[m.Source] = -1
				continue
			}
			u := upMount{point: m.Point, state: m.Source}
			if h, ok := daemonlock.ReadHolder(lock); ok && held {
				u.holder = h
			}
			index[m.Source] = len(out)
			out = append(out, u)
		case i >= 0 && out[i].point != out[i].holder.Mountpoint:
			out[i].point = m.Point
		}
	}
	return out
}

// pickTarget chooses the daemon that "ls", "history", "status" and
// "lock" work with, in the one order of docs/PROTOCOL.md §8, "Which
// daemon", the first that applies:
//
//  1. the flags: stateFlag, or the source of the leasefs mount mountFlag;
//  2. the environment: $LEASEFS_STATE, or the source of the leasefs mount
//     $LEASEFS_MOUNT; with both set, $LEASEFS_STATE, and a leasefs mount
//     on $LEASEFS_MOUNT must be one of it (its mountpoint is then the
//     target's), while $LEASEFS_MOUNT on no leasefs mount is ignored;
//  3. the one leasefs mount of mounts that is up, or, when store names an
//     etcd store (--store), the first one up serving it;
//  4. the default state directory.
//
// Errors: a usage error for both flags, for a mountFlag or a lone
// $LEASEFS_MOUNT that is not a leasefs mount, for $LEASEFS_STATE and
// $LEASEFS_MOUNT naming different daemons, and for several leasefs mounts
// up with none named and no store (the message lists them).
func pickTarget(stateFlag, mountFlag, store string, mounts []procfs.MountInfo) (daemonTarget, error) {
	switch {
	case stateFlag != "" && mountFlag != "":
		return daemonTarget{}, usageError{errors.New("give --state or --mount, not both")}
	case stateFlag != "":
		return describe(stateFlag, fromStateFlag)
	case mountFlag != "":
		return mountTarget(mountFlag, "--mount", fromMountFlag, mounts)
	}
	stateEnv, mountEnv := os.Getenv("LEASEFS_STATE"), os.Getenv("LEASEFS_MOUNT")
	switch {
	case stateEnv != "" && mountEnv != "":
		t, err := describe(stateEnv, fromStateEnv)
		m, merr := mountTarget(mountEnv, "$LEASEFS_MOUNT", fromMountEnv, mounts)
		switch {
		case err != nil || merr != nil:
			// No leasefs mount on $LEASEFS_MOUNT: $LEASEFS_STATE alone
			// decides, so that a stopped daemon's records can be read.
			return t, err
		case m.State != t.State:
			return daemonTarget{}, usageError{fmt.Errorf("$LEASEFS_STATE %s and $LEASEFS_MOUNT %s name different daemons ($LEASEFS_MOUNT serves %s): unset one, or name the daemon with --state or --mount",
				t.State, m.Mountpoint, m.State)}
		}
		t.Mountpoint = m.Mountpoint
		return t, nil
	case stateEnv != "":
		return describe(stateEnv, fromStateEnv)
	case mountEnv != "":
		return mountTarget(mountEnv, "$LEASEFS_MOUNT", fromMountEnv, mounts)
	}
	ups := upMounts(mounts)
	if store != "" {
		for _, u := range ups {
			if u.holder.Store == store {
				return describe(u.state, fromStoreUp)
			}
		}
		return describe(mount.DefaultStateDir(), fromDefault)
	}
	switch len(ups) {
	case 0:
		return describe(mount.DefaultStateDir(), fromDefault)
	case 1:
		t, err := describe(ups[0].state, fromMountUp)
		if err == nil && t.Mountpoint == "" {
			t.Mountpoint = ups[0].point
		}
		return t, err
	default:
		lines := make([]string, len(ups))
		for i, u := range ups {
			lines[i] = "  " + u.String()
		}
		return daemonTarget{}, usageError{fmt.Errorf("%d leasefs mounts are up; name one with --mount DIR or --state DIR (or set LEASEFS_MOUNT or LEASEFS_STATE):\n%s",
			len(ups), strings.Join(lines, "\n"))}
	}
}

// mountTarget returns the target of the leasefs mount on dir, named by
// what (a flag or a variable) and chosen as from: its source is its state
// directory. Only dir's parent is resolved (mountinfo shows resolved
// paths): a stat of the mountpoint itself would ask its daemon, which may
// be hung. Errors: a usage error when no leasefs mount is on dir.
func mountTarget(dir, what, from string, mounts []procfs.MountInfo) (daemonTarget, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return daemonTarget{}, err
	}
	if real, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		abs = filepath.Join(real, filepath.Base(abs))
	}
	var found *procfs.MountInfo
	for i, m := range mounts {
		if m.Point == abs {
			found = &mounts[i] // later lines are mounted on top
		}
	}
	if found == nil || found.FSType != leasefsFSType {
		return daemonTarget{}, usageError{fmt.Errorf("%s %s: not a leasefs mount", what, abs)}
	}
	t, err := describe(found.Source, from)
	t.Mountpoint = abs
	return t, err
}

// lockMount returns the mount "leasefs lock" works in: that of the daemon
// [pickTarget] chooses from flag (--mount), the environment and mounts —
// the leasefs mount named by flag or $LEASEFS_MOUNT itself, else the
// mountpoint the daemon records. Errors: the usage errors of pickTarget,
// and a usage error when no daemon serves the state directory chosen or
// it records no mountpoint.
func lockMount(flag string, mounts []procfs.MountInfo) (string, error) {
	t, err := pickTarget("", flag, "", mounts)
	if err != nil {
		return "", err
	}
	if t.From == fromMountFlag || t.From == fromMountEnv || t.Served && t.Mountpoint != "" {
		return t.Mountpoint, nil
	}
	why := "no daemon serves " + t.State
	if t.Served {
		why = "the daemon serving " + t.State + " records no mountpoint"
	}
	return "", usageError{fmt.Errorf("cannot find the leasefs mount; pass --mount DIR, or set LEASEFS_MOUNT, or LEASEFS_STATE to the state directory its daemon serves (%s, %s)", why, t.From)}
}

// targetFlags are the flags with which "ls", "history" and "status" name
// the store they read: --state, --mount and the store flags.
type targetFlags struct {
	state, mount string
	sf           storeFlags
}

// add registers the flags on f.
func (tf *targetFlags) add(f *pflag.FlagSet) {
	f.StringVar(&tf.state, "state", "", "state directory of the lease store (default: found as described above)")
	f.StringVar(&tf.mount, "mount", "", "read the store of the daemon serving this leasefs mount")
	tf.sf.add(f)
	// The store defaults to the one the daemon's lock records
	// ([targetFlags.resolve]).
	store := f.Lookup("store")
	store.DefValue = ""
	store.Usage = "where leases live: file or etcd://HOST:PORT[,HOST:PORT...]/PREFIX (default: the store the daemon's lock records, else file)"
}

// resolve chooses the target ([pickTarget]) and, unless --store was
// given, the store its daemon's lock records (the file store when none
// serves it). An etcd --store is passed to pickTarget: with no daemon
// named, the state directory only gives the daemon identity of the store
// ([openForReading]), that of a daemon up serving it, else the default
// one, so that several mounts up are no error.
func (tf *targetFlags) resolve(cmd *cobra.Command) (daemonTarget, error) {
	named := cmd.Flags().Changed("store")
	store := ""
	if named && tf.sf.store != "file" {
		store = tf.sf.store
	}
	t, err := pickTarget(tf.state, tf.mount, store, procfs.Mounts())
	if err != nil || named {
		return t, err
	}
	tf.sf.store = "file"
	if t.Served && t.Holder.Store != "" {
		tf.sf.store = t.Holder.Store
	}
	return t, nil
}

// open opens the store of the target for reading ([openForReading]). When
// no daemon serves the target's file store it says so on stderr, before
// anything is listed (docs/PROTOCOL.md §8, "Which daemon").
func (tf *targetFlags) open(cmd *cobra.Command) (leasecore.Store, error) {
	t, err := tf.resolve(cmd)
	if err != nil {
		return nil, err
	}
	s, err := openForReading(cmd.Context(), t.State, &tf.sf, cmd.ErrOrStderr())
	if err != nil {
		return nil, err
	}
	if !t.Served && tf.sf.store == "file" {
		fmt.Fprintf(cmd.ErrOrStderr(), "leasefs: no daemon serves %s, %s; showing the records of its file store\n", t.State, t.From)
	}
	return s, nil
}
