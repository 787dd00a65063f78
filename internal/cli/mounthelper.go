package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/leasefs/leasefs/mount"
)

// The mount helper form (docs/PROTOCOL.md §8b). For
// "mount -t fuse.leasefs STATE MOUNTPOINT -o OPTIONS", and for an /etc/fstab
// line of type fuse.leasefs, mount(8) runs mount.fuse3, which runs
// "leasefs STATE MOUNTPOINT -o OPTIONS" (leasefs found in the standard PATH
// that mount(8) sets: /usr/local/sbin, /usr/local/bin, /usr/sbin, /usr/bin,
// /sbin, /bin) and waits for it to exit. mount(8) gives MOUNTPOINT as an
// absolute path and OPTIONS without its own bookkeeping options (defaults,
// noauto, nofail, _netdev, x-*), adding rw or ro; mount.fuse3 adds dev,suid
// when run as root.
//
// In that form leasefs starts "leasefs mount" in the background and exits 0
// once the mount answers, or with the daemon's exit code and log when it
// fails first. The daemon runs in a session of its own, with stdin from
// /dev/null and its log appended to <STATE>/leasefs.log; it tells the helper
// that the mount answers by sending READY=1 to a notify socket of the
// helper's own (the systemd notify protocol it speaks anyway).

// helperLogName is the daemon's log file in the state directory, when the
// mount helper form started it.
const helperLogName = "leasefs.log"

// helperReadyTimeout bounds how long the mount helper waits for the daemon
// to report that the mount answers, on top of any takeover_timeout.
const helperReadyTimeout = 60 * time.Second

// helperStopWait is how long the mount helper gives a daemon it stops
// (after helperReadyTimeout, or when the helper is interrupted) between
// SIGTERM and SIGKILL.
const helperStopWait = 10 * time.Second

// helperOption says how the mount helper form maps one -o option to a flag
// of "leasefs mount".
type helperOption struct {
	flag  string // the flag it sets
	value bool   // the option is name=value, else a bare name
}

// helperOptions are the leasefs options of the mount helper form.
var helperOptions = map[string]helperOption{
	"allow_other":        {flag: "--allow-other"},
	"lease_duration":     {flag: "--lease-duration", value: true},
	"store":              {flag: "--store", value: true},
	"etcd_grace":         {flag: "--etcd-grace", value: true},
	"max_leases_per_uid": {flag: "--max-leases-per-uid", value: true},
	"history_keep":       {flag: "--history-keep", value: true},
	"takeover":           {flag: "--takeover"},
	"takeover_timeout":   {flag: "--takeover-timeout", value: true},
	"metrics_addr":       {flag: "--metrics-addr", value: true},
	"pprof":              {flag: "--pprof"},
	"log_format":         {flag: "--log-format", value: true},
	"log_level":          {flag: "--log-level", value: true},
	"debug":              {flag: "--debug"},
}

// ignoredOptions are the generic options that mount(8), mount.fuse3 or an
// fstab line may pass and that change nothing for leasefs: bookkeeping of
// mount(8) and fstab, device, setuid and exec bits (lease files have none,
// and leasefs always mounts nodev,nosuid), access times (leasefs keeps
// none) and sync (every change is durable before its reply anyway).
// Options starting with "x-" or "comment=" are ignored too.
var ignoredOptions = []string{
	"rw", "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group",
	"_netdev", "nofail", "dev", "nodev", "suid", "nosuid", "exec", "noexec",
	"atime", "noatime", "relatime", "norelatime", "strictatime", "nostrictatime",
	"diratime", "nodiratime", "lazytime", "nolazytime", "sync", "async", "dirsync",
	"silent", "loud",
}

// isMountHelper reports whether args, the command line without the program
// name, is the mount helper form "SOURCE MOUNTPOINT [-o OPTIONS]…": the
// first argument is not a command of root nor a flag, the second is an
// absolute path, as mount(8) passes it, and either options follow (mount(8)
// always passes at least rw or ro) or SOURCE is a path with a slash. So a
// mistyped command ("leasefs moutn /mnt/leases") stays an unknown command
// instead of mounting a state directory of that name.
func isMountHelper(root *cobra.Command, args []string) bool {
	if len(args) < 2 || args[0] == "" || strings.HasPrefix(args[0], "-") || !filepath.IsAbs(args[1]) {
		return false
	}
	if !strings.Contains(args[0], "/") && (len(args) < 3 || !strings.HasPrefix(args[2], "-o")) {
		return false
	}
	switch args[0] {
	case "help", "completion":
		return false
	}
	for _, c := range root.Commands() {
		if c.Name() == args[0] || c.HasAlias(args[0]) {
			return false
		}
	}
	return !strings.HasPrefix(args[0], "__") // cobra's hidden completion commands
}

// mountHelper is a parsed mount helper command line.
type mountHelper struct {
	state      string   // the state directory (SOURCE), absolute
	mountpoint string   // absolute
	flags      []string // flags of "leasefs mount" that the options set
	// readyTimeout bounds the wait for the daemon's READY=1.
	readyTimeout time.Duration
}

// parseMountHelper parses the mount helper form args ([isMountHelper]).
// Errors are usage errors: an unknown option, a missing or unexpected
// value, an unexpected argument.
func parseMountHelper(args []string) (mountHelper, error) {
	source, mp := args[0], args[1]
	var opts []string
	for rest := args[2:]; len(rest) > 0; rest = rest[1:] {
		switch a := rest[0]; {
		case a == "-o" && len(rest) > 1:
			opts = append(opts, strings.Split(rest[1], ",")...)
			rest = rest[1:]
		case strings.HasPrefix(a, "-o") && len(a) > 2:
			opts = append(opts, strings.Split(a[2:], ",")...)
		default:
			return mountHelper{}, usageError{fmt.Errorf("unexpected argument %q: want STATE MOUNTPOINT [-o OPTIONS]", a)}
		}
	}
	state, err := filepath.Abs(source)
	if err != nil {
		return mountHelper{}, err
	}
	h := mountHelper{state: state, mountpoint: filepath.Clean(mp), readyTimeout: helperReadyTimeout + mount.DefaultTakeoverTimeout}
	for _, o := range opts {
		name, value, hasValue := strings.Cut(o, "=")
		if o == "" || slices.Contains(ignoredOptions, o) || strings.HasPrefix(o, "x-") || name == "comment" {
			continue
		}
		if o == "ro" {
			return mountHelper{}, usageError{errors.New("mount option ro: leasefs cannot be mounted read-only")}
		}
		spec, ok := helperOptions[name]
		switch {
		case !ok:
			return mountHelper{}, usageError{fmt.Errorf("unknown mount option %q (leasefs takes %s)", o, strings.Join(helperOptionNames(), ", "))}
		case spec.value && !hasValue:
			return mountHelper{}, usageError{fmt.Errorf("mount option %s needs a value: %s=…", name, name)}
		case !spec.value && hasValue:
			return mountHelper{}, usageError{fmt.Errorf("mount option %s takes no value, got %q", name, o)}
		case name == "store":
			// mount(8) splits options at commas: the endpoints of an etcd
			// store are joined with "+" (docs/PROTOCOL.md §8).
			h.flags = append(h.flags, spec.flag, strings.ReplaceAll(value, "+", ","))
		case spec.value:
			h.flags = append(h.flags, spec.flag, value)
		default:
			h.flags = append(h.flags, spec.flag)
		}
		if name == "takeover_timeout" {
			// The daemon checks the value; a bad one fails it at once.
			if d, err := time.ParseDuration(value); err == nil && d > 0 {
				h.readyTimeout = helperReadyTimeout + d
			}
		}
	}
	return h, nil
}

// helperOptionNames returns the names of [helperOptions], sorted.
func helperOptionNames() []string {
	names := make([]string, 0, len(helperOptions))
	for n, o := range helperOptions {
		if o.value {
			n += "=…"
		}
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// mountArgs returns the "leasefs mount" command line that serves h.
func (h mountHelper) mountArgs() []string {
	args := append([]string{"mount", "--state", h.state}, h.flags...)
	return append(args, h.mountpoint)
}

// runMountHelper runs the mount helper form args and returns the exit code:
// 0 once the mount answers, 2 for a usage error, else the exit code of the
// daemon that failed (1 when it had none of its own).
func runMountHelper(ctx context.Context, args []string, stderr io.Writer) int {
	h, err := parseMountHelper(args)
	if err == nil {
		err = h.start(ctx, stderr)
	}
	var code exitCode
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &code):
		return int(code)
	}
	fmt.Fprintln(stderr, "leasefs:", message(err))
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitError
}

// start starts the daemon in the background and waits until the mount
// answers. When the daemon fails first, start copies what it logged to
// stderr and returns its exit code as an [exitCode].
func (h mountHelper) start(ctx context.Context, stderr io.Writer) error {
	// Nothing is created before the checks that "leasefs mount" makes
	// before it creates anything.
	if err := mount.CheckPaths(h.mountpoint, h.state); err != nil {
		return err
	}
	if err := os.MkdirAll(h.state, 0o700); err != nil {
		return fmt.Errorf("cannot create the state directory: %w", err)
	}
	logPath := filepath.Join(h.state, helperLogName)
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("cannot open the daemon's log: %w", err)
	}
	defer logFile.Close()
	logStart, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("cannot open the daemon's log: %w", err)
	}

	// The notify socket lives in a directory only we may enter.
	dir, err := os.MkdirTemp("", "leasefs-mount-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("cannot listen for the daemon's readiness: %w", err)
	}
	defer conn.Close()
	ready := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			if slices.Contains(strings.Split(string(buf[:n]), "\n"), notifyReady) {
				close(ready)
				return
			}
		}
	}()

	self, err := os.Executable()
	if err != nil {
		return err
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devNull.Close()
	cmd := exec.Command(self, h.mountArgs()...)
	cmd.Dir = "/"
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devNull, logFile, logFile
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "NOTIFY_SOCKET=")
	}), "NOTIFY_SOCKET="+socket)
	// A session of its own: no terminal, and no signal meant for mount(8)'s
	// process group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot start the daemon: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()

	timeout := time.NewTimer(h.readyTimeout)
	defer timeout.Stop()
	var why string
	select {
	case <-ready:
		return nil
	case <-exited:
		why = fmt.Sprintf("the daemon exited with code %d before the mount answered", cmd.ProcessState.ExitCode())
	case <-timeout.C:
		why = fmt.Sprintf("the mount did not answer within %s; the daemon was stopped", h.readyTimeout)
		stopDaemon(cmd, exited)
	case <-ctx.Done():
		why = "interrupted before the mount answered; the daemon was stopped"
		stopDaemon(cmd, exited)
	}
	copyLog(stderr, logPath, logStart)
	fmt.Fprintf(stderr, "leasefs: %s (its log: %s)\n", why, logPath)
	if code := cmd.ProcessState.ExitCode(); code > 0 {
		return exitCode(code)
	}
	return exitCode(exitError)
}

// stopDaemon ends the daemon cmd that has not reported ready: SIGTERM, and
// SIGKILL after helperStopWait. exited is closed once it has been waited for.
func stopDaemon(cmd *exec.Cmd, exited <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return
	case <-time.After(helperStopWait):
	}
	_ = cmd.Process.Kill()
	<-exited
}

// copyLog copies to w what the daemon logged to path from offset on: its
// reason for failing, at most the last 64 KiB of it.
func copyLog(w io.Writer, path string, offset int64) {
	const most = 64 << 10
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size()-offset > most {
		offset = st.Size() - most
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return
	}
	_, _ = io.Copy(w, f)
}
