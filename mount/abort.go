package mount

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/internal/procfs"
)

// fusectlDir is where the fusectl filesystem exposes one directory per
// FUSE connection, with an abort file in each (kernel FUSE documentation).
const fusectlDir = "/sys/fs/fuse/connections"

// AbortConnection aborts the leasefs FUSE connection mounted on mp through
// fusectl, mounting fusectl on /sys/fs/fuse/connections first if needed
// (root only). Requests waiting on the connection fail, which frees kernel
// threads blocked behind them; the mount then answers ENOTCONN. Errors: no
// leasefs mount on mp; mount(2) and write errors.
func AbortConnection(mp string) error {
	var minor string
	for _, m := range procfs.Mounts() {
		if m.Point == mp && m.FSType == fsType {
			minor = m.Minor
		}
	}
	if minor == "" {
		return fmt.Errorf("no leasefs mount on %s", mp)
	}
	if _, err := os.Stat(filepath.Join(fusectlDir, minor)); errors.Is(err, os.ErrNotExist) {
		if err := unix.Mount("fusectl", fusectlDir, "fusectl", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount fusectl: %w", err)
		}
	}
	return os.WriteFile(filepath.Join(fusectlDir, minor, "abort"), []byte("1"), 0)
}

// abortDyingHolder handles a daemon lock held by a daemon that was killed
// but cannot exit: a thread of it is blocked in a kernel notification on
// its own mount, waiting for a request that only it could answer. Aborting
// its connection frees it. It reports whether it aborted.
func abortDyingHolder(held *daemonlock.HeldError, mp string, log *slog.Logger) bool {
	if held.Holder.PID <= 0 || held.Holder.Host != procfs.Hostname() || !procfs.KillPending(held.Holder.PID) {
		return false
	}
	target := mp
	if p, ok := strings.CutPrefix(held.Holder.Client, "leasefs mount "); ok {
		target = p
	}
	if err := AbortConnection(target); err != nil {
		log.Warn("cannot abort the killed daemon's connection", "pid", held.Holder.PID, "mountpoint", target, "err", err)
		return false
	}
	log.Warn("aborted the FUSE connection of a killed daemon that could not exit", "pid", held.Holder.PID, "mountpoint", target)
	return true
}
