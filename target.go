package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/mount"
)

// leasefsFSType is the filesystem type of leasefs mounts in
// /proc/self/mountinfo.
const leasefsFSType = "fuse.leasefs"

// Where a [daemonTarget] came from, in the order of precedence of
// docs/PROTOCOL.md §8, "Which daemon".
const (
	fromStateFlag = "given with --state"
	fromMountFlag = "the source of --mount"
	fromStateEnv  = "named by $LEASEFS_STATE"
	fromMountUp   = "the source of the one leasefs mount up"
	fromDefault   = "the default state directory (no leasefs mount is up)"
)

// targetHelp is the paragraph of "ls", "history" and "status" that says
// which store they read (docs/PROTOCOL.md §8, "Which daemon").
const targetHelp = `The store is the one of --state DIR, or of the daemon serving --mount DIR;
else of $LEASEFS_STATE; else of the one leasefs mount that is up; else of
the default state directory. With several leasefs mounts up and none
named, it lists them and exits 2. The store is the one the daemon's lock
records, an etcd store included (read with the --etcd-* flags and
$LEASEFS_ETCD_PASSWORD, as for mount); --store names another.`

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
func upMounts(mounts []mount.MountInfo) []upMount {
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

// pickTarget chooses the state directory that "ls", "history", "status"
// and "lock" work with (docs/PROTOCOL.md §8, "Which daemon"): stateFlag,
// else the source of the leasefs mount mountFlag, else $LEASEFS_STATE,
// else the one leasefs mount of mounts that is up, else the default state
// directory. Errors: a usage error for both flags, for a mountFlag that is
// not a leasefs mount, and for several leasefs mounts up with none named
// (the message lists them).
func pickTarget(stateFlag, mountFlag string, mounts []mount.MountInfo) (daemonTarget, error) {
	switch {
	case stateFlag != "" && mountFlag != "":
		return daemonTarget{}, usageError{errors.New("give --state or --mount, not both")}
	case stateFlag != "":
		return describe(stateFlag, fromStateFlag)
	case mountFlag != "":
		return mountTarget(mountFlag, mounts)
	}
	if s := os.Getenv("LEASEFS_STATE"); s != "" {
		return describe(s, fromStateEnv)
	}
	switch ups := upMounts(mounts); len(ups) {
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
		return daemonTarget{}, usageError{fmt.Errorf("%d leasefs mounts are up; name one with --mount DIR or --state DIR (or set LEASEFS_STATE):\n%s",
			len(ups), strings.Join(lines, "\n"))}
	}
}

// mountTarget returns the target of the leasefs mount on dir: its source
// is its state directory. Only dir's parent is resolved (mountinfo shows
// resolved paths): a stat of the mountpoint itself would ask its daemon,
// which may be hung. Errors: a usage error when no leasefs mount is on dir.
func mountTarget(dir string, mounts []mount.MountInfo) (daemonTarget, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return daemonTarget{}, err
	}
	if real, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		abs = filepath.Join(real, filepath.Base(abs))
	}
	var found *mount.MountInfo
	for i, m := range mounts {
		if m.Point == abs {
			found = &mounts[i] // later lines are mounted on top
		}
	}
	if found == nil || found.FSType != leasefsFSType {
		return daemonTarget{}, usageError{fmt.Errorf("--mount %s: not a leasefs mount", abs)}
	}
	t, err := describe(found.Source, fromMountFlag)
	t.Mountpoint = abs
	return t, err
}

// lockMount returns the mount "leasefs lock" works in (docs/PROTOCOL.md
// §8, "Which daemon"): flag, else $LEASEFS_MOUNT, else the mountpoint of
// the daemon [pickTarget] finds ($LEASEFS_STATE's, the one leasefs mount
// up, the default state directory's). Errors: the usage errors of
// pickTarget, and a usage error when the daemon found serves no mount.
func lockMount(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if m := os.Getenv("LEASEFS_MOUNT"); m != "" {
		return m, nil
	}
	t, err := pickTarget("", "", mount.Mounts())
	if err != nil {
		return "", err
	}
	if t.Served && t.Mountpoint != "" {
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
// serves it). With an etcd --store and no --state, --mount or
// $LEASEFS_STATE, the state directory only gives the daemon identity of
// the store ([openForReading]): that of a daemon up serving that store,
// else the default one, so that several mounts up are no error.
func (tf *targetFlags) resolve(cmd *cobra.Command) (daemonTarget, error) {
	mounts := mount.Mounts()
	named := cmd.Flags().Changed("store")
	if named && tf.sf.store != "file" && tf.state == "" && tf.mount == "" && os.Getenv("LEASEFS_STATE") == "" {
		for _, u := range upMounts(mounts) {
			if u.holder.Store == tf.sf.store {
				return describe(u.state, fromMountUp)
			}
		}
		return describe(mount.DefaultStateDir(), fromDefault)
	}
	t, err := pickTarget(tf.state, tf.mount, mounts)
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
