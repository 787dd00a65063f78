package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/client"
	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/leasecore"
)

// Exit codes of "leasefs lock" besides the command's own status
// (docs/PROTOCOL.md §8).
const (
	// exitConflict: -n found the name held, or -w timed out (flock(1)'s 1;
	// -E sets another).
	exitConflict = 1
	// exitLost: the lease was lost while the command ran (the daemon stopped
	// or lost its store); the command and every process it started were
	// sent SIGTERM, then SIGKILL.
	exitLost = 4
	// exitCannotRun and exitNotFound: the command was found but could not
	// be run, or was not found; the shell's and timeout(1)'s 126 and 127,
	// so that neither reads as a conflict.
	exitCannotRun = 126
	exitNotFound  = 127
	// exitNoInput: NAME could not be opened — no leasefs mount was given or
	// found, NAME's namespace does not exist, NAME is a directory —
	// flock(1)'s EX_NOINPUT (sysexits.h), so that it does not read as a
	// conflict.
	exitNoInput = 66
	// exitUnavailable: the lock or the lease could not be taken or read
	// for a reason other than a conflict (the daemon stopped or failed
	// during the wait): sysexits.h's EX_UNAVAILABLE.
	exitUnavailable = 69
)

// failedWith is an error of lock that is printed and ends the command
// with code.
type failedWith struct {
	err  error
	code int
}

func (e failedWith) Error() string { return e.err.Error() }
func (e failedWith) Unwrap() error { return e.err }

// lockCheckEvery is how often "leasefs lock" checks, through its locked
// descriptor, that the lease still holds while the command runs.
const lockCheckEvery = 250 * time.Millisecond

// defaultLostGrace is how long a command whose lease was lost has between
// SIGTERM and SIGKILL.
const defaultLostGrace = 10 * time.Second

// forwarded are the signals "leasefs lock" passes on to the command.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

// lockOptions are the flags of "leasefs lock".
type lockOptions struct {
	noWait   bool
	wait     time.Duration
	waitSet  bool // -w was given (-w 0: do not wait)
	conflict int
	mount    string
	grace    time.Duration
	// reconnect bounds how long the command keeps running while the
	// daemon does not answer (--reconnect-timeout).
	reconnect time.Duration
}

func newLockCmd(stdout, stderr io.Writer) *cobra.Command {
	var o lockOptions
	cmd := &cobra.Command{
		Use:   "lock [-n | -w DURATION] [-E CODE] [--grace DURATION] [--reconnect-timeout DURATION] [--mount DIR] NAME [--] CMD [ARG...]",
		Short: "Run a command while holding a handle lease on NAME (like flock(1))",
		Long: `Run CMD while holding a handle lease on NAME, the lease file NAME under
the mount: the lease lives exactly as long as CMD, and ends even if CMD is
killed. CMD gets LEASEFS_RESOURCE, LEASEFS_LEASE_ID and LEASEFS_GENERATION
(the fencing token: strictly larger for every newer lease) in its
environment, and does not inherit the locked descriptor.

Options come before NAME; everything after NAME is CMD and its arguments,
as with flock(1) ("--" before CMD is optional). Without -n or -w, lock
waits first come first served until NAME is free, however long that takes.
A conflict names the holder (uid, pid, host, since).
It exits with CMD's status (128+N when CMD died of signal N); 1 (or -E) on
conflict (-n) or timeout (-w; -w 0 does not wait); 127 when CMD is not
found and 126 when it cannot be run (as a shell; a script without #! runs
with /bin/sh); 66 when NAME cannot be opened (no leasefs mount, a missing
namespace, a directory; flock(1)'s code); 69 when the lock could not be
taken for another reason than a conflict (the daemon stopped during the
wait); 4 when the lease was lost while CMD ran (ended by root's rm, a
takeover honoured, or the store; or the daemon did not come back within
--reconnect-timeout): CMD and every process it started then get SIGTERM,
and SIGKILL after --grace. A daemon restart does not stop CMD: lock waits
for the mount to answer again and takes its lease back (on etcd, it stops
CMD before the cluster could expire the lease). Signals sent to lock are passed on to CMD; one that
arrives while lock waits ends the wait (128+N). If lock is killed, CMD is
killed with it (SIGKILL); processes CMD started are not, so let CMD do its
work itself or exec it.

The mount is that of the daemon "leasefs ls" would read, chosen in the
same order: the leasefs mount --mount names; else that of $LEASEFS_STATE's
daemon, or the leasefs mount $LEASEFS_MOUNT names (with both set,
$LEASEFS_MOUNT, which must serve $LEASEFS_STATE); else
the one leasefs mount that is up (with several up, name one); else the
mount of the default state directory's daemon (docs/PROTOCOL.md §8 in the
source tree, "Which daemon").`,
		Example: `  leasefs lock deploy ./deploy.sh               # wait for the lease, run, release
  leasefs lock -n nightly -- make backup         # give up at once if held
  leasefs lock -w 30s -E 75 db/migrate -- ./migrate
  leasefs lock ci/job -- sh -c 'echo "fencing token $LEASEFS_GENERATION"'`,
		ValidArgsFunction: completeLeaseNames,
		Args: func(c *cobra.Command, a []string) error {
			if len(a) < 2 || (len(a) == 2 && a[1] == "--") {
				return usageError{errors.New("want NAME [--] CMD [ARG...]")}
			}
			return nil
		},
		RunE: func(c *cobra.Command, a []string) error {
			o.waitSet = c.Flags().Changed("wait")
			switch {
			case o.noWait && o.waitSet:
				return usageError{errors.New("-n and -w exclude each other")}
			case o.wait < 0:
				return usageError{fmt.Errorf("-w %s: must not be negative", o.wait)}
			case o.conflict < 0 || o.conflict > 255:
				return usageError{fmt.Errorf("-E %d: an exit code is 0 to 255", o.conflict)}
			case o.grace < 0:
				return usageError{fmt.Errorf("--grace %s: must not be negative", o.grace)}
			case o.reconnect < 0:
				return usageError{fmt.Errorf("--reconnect-timeout %s: must not be negative", o.reconnect)}
			}
			// Flags end at NAME (SetInterspersed below), so a "--" after
			// NAME is the separator flock(1) also accepts there.
			argv := a[1:]
			if argv[0] == "--" {
				argv = argv[1:]
			}
			code, err := runLock(c.Context(), o, a[0], argv, stderr)
			if err != nil {
				return err
			}
			if code != 0 {
				return exitCode(code)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false)
	f.BoolVarP(&o.noWait, "nonblock", "n", false, "fail at once if NAME is held")
	f.VarP((*waitDuration)(&o.wait), "wait", "w", "give up after waiting this long: a duration (30s, 1m30s) or seconds as flock(1) takes them (30, 0.5); 0 does not wait")
	// Without -w, lock waits until NAME is free: say so rather than "0s".
	f.Lookup("wait").DefValue = "wait forever"
	f.IntVarP(&o.conflict, "conflict-exit-code", "E", exitConflict, "exit code on conflict or timeout")
	f.StringVar(&o.mount, "mount", "", "the leasefs mount (default: $LEASEFS_MOUNT or $LEASEFS_STATE's daemon's, else the one leasefs mount up, as \"leasefs ls\" finds it)")
	f.DurationVar(&o.grace, "grace", defaultLostGrace, "time between SIGTERM and SIGKILL when the lease is lost")
	f.DurationVar(&o.reconnect, "reconnect-timeout", client.DefaultReconnectTimeout, "how long CMD keeps running while the daemon does not answer (a restart) before the lease counts as lost; on etcd never past the lease's keep-alive deadline")
	return cmd
}

// waitDuration is the value of lock's -w: a Go duration ("30s", "1m30s")
// or, as flock(1)'s -w takes it, a plain number of seconds ("30", "0.5").
// A pflag.Value; not safe for concurrent use.
type waitDuration time.Duration

func (d *waitDuration) String() string { return time.Duration(*d).String() }

func (d *waitDuration) Type() string { return "duration" }

// Set parses s. Errors: neither a duration nor a decimal number of
// seconds, or one beyond what time.Duration holds (about 292 years).
func (d *waitDuration) Set(s string) error {
	if v, err := time.ParseDuration(s); err == nil {
		*d = waitDuration(v)
		return nil
	}
	secs, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(secs) || math.IsInf(secs, 0) || math.Abs(secs) > math.MaxInt64/float64(time.Second) {
		return fmt.Errorf("%q: want a duration (30s, 1m30s) or a number of seconds (30, 0.5)", s)
	}
	*d = waitDuration(time.Duration(secs * float64(time.Second)))
	return nil
}

// runLock takes the lease, runs argv and returns the exit code.
func runLock(ctx context.Context, o lockOptions, name string, argv []string, stderr io.Writer) (int, error) {
	if err := checkLockName(name); err != nil {
		return 0, err
	}
	mnt, err := lockMount(o.mount, procfs.Mounts())
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			err = ue.error
		}
		return 0, failedWith{err, exitNoInput}
	}
	if err := checkLeasefsMount(mnt); err != nil {
		return 0, failedWith{err, exitNoInput}
	}
	// The command is started from this goroutine's thread, which is kept
	// for the life of the process: the command's parent-death signal
	// (below) follows the thread that started it.
	runtime.LockOSThread()
	// Signals are caught from the start: one that arrives while lock waits
	// ends the wait (nothing is held), one that arrives later is passed on.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	h, sig, err := takeLock(ctx, mnt, name, o, sigs, stderr, argv[0])
	switch {
	case sig != nil:
		return 128 + int(sig.(syscall.Signal)), nil
	case ctx.Err() != nil:
		return 128 + int(syscall.SIGINT), nil
	case errors.Is(err, client.ErrHeld):
		fmt.Fprintf(stderr, "leasefs: %v\n", err)
		return o.conflict, nil
	case errors.Is(err, context.DeadlineExceeded):
		fmt.Fprintf(stderr, "leasefs: %s still held after %s%s\n", name, o.wait, heldBy(mnt, name))
		return o.conflict, nil
	case errors.Is(err, client.ErrNoNamespace):
		return 0, failedWith{err, exitNoInput}
	case err != nil:
		var pe *os.PathError
		if errors.As(err, &pe) && pe.Op == "open" {
			return 0, failedWith{fmt.Errorf("cannot open %s: %w", pe.Path, pe.Err), exitNoInput}
		}
		return 0, failedWith{fmt.Errorf("cannot lock %s: %w", filepath.Join(mnt, name), err), exitUnavailable}
	}
	// The lease ends before lock exits, however it exits: the unlock is
	// answered once the daemon has ended the lease (docs/PROTOCOL.md §6). A
	// caller that runs lock again at once, or checks the name, finds it
	// free.
	defer func() { _ = h.Unlock() }()
	st := h.Status()
	// Processes the command leaves behind (a shell's children, once the
	// shell is gone) become this process's children instead of init's, so
	// that a lost lease stops them too (stopTree).
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	env := append(os.Environ(), "LEASEFS_RESOURCE="+st.Resource, "LEASEFS_LEASE_ID="+st.LeaseID,
		"LEASEFS_GENERATION="+strconv.FormatUint(st.Generation, 10))
	cmd := command(argv, env)
	err = cmd.Start()
	if errors.Is(err, syscall.ENOEXEC) {
		// A script without a #! line: run it with /bin/sh, as execvp(3)
		// and so flock(1) and a shell do.
		cmd = command(append([]string{"/bin/sh", cmd.Path}, argv[1:]...), env)
		err = cmd.Start()
	}
	if err != nil {
		// The lease ends by the deferred unlock.
		fmt.Fprintf(stderr, "leasefs: cannot run %s: %v\n", argv[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound, nil
		}
		return exitCannotRun, nil
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	// Signals reach the command while a check below waits: a read of a
	// handle lease in jeopardy waits for the cluster (docs/PROTOCOL.md
	// §8a, "Elections and jeopardy"), and is not a lost lease.
	go func() {
		for {
			select {
			case s := <-sigs:
				_ = cmd.Process.Signal(s)
			case <-exited:
				return
			}
		}
	}()
	// lost stops the command's tree once the lease is found lost (err),
	// while it ran or as it ended, and returns exitLost.
	lost := func(err error) int {
		fmt.Fprintf(stderr, "leasefs: %v; stopping %s and what it started\n", err, argv[0])
		stopTree(exited, o.grace)
		return exitLost
	}
	// Each check reads the lease through its descriptor and, while the
	// daemon does not answer, tries to take it back through a new open
	// file (docs/PROTOCOL.md §6, §8).
	check := time.NewTicker(lockCheckEvery)
	defer check.Stop()
	for {
		select {
		case <-exited:
			// The lease may have been lost while the command ran, since the
			// last check: then its work was not covered (exit 4), and what
			// it left running is stopped as below. While the daemon is
			// away, the outcome waits for it (or for the deadline).
			for {
				if err := h.Check(); err != nil {
					return lost(err), nil
				}
				if !h.Away() {
					return waitStatus(cmd.ProcessState), nil
				}
				time.Sleep(lockCheckEvery)
			}
		case <-check.C:
			reapOrphans(cmd.Process.Pid)
			if err := h.Check(); err != nil {
				return lost(err), nil
			}
		}
	}
}

// takeLock takes NAME under mnt as a handle lease: at once with -n or -w 0,
// waiting first come first served otherwise, at most o.wait with -w, until
// ctx ends or a signal arrives on sigs (then sig is that signal and
// nothing is held). The lease's checks report a daemon that stops
// answering, and a lease taken back, on stderr.
func takeLock(ctx context.Context, mnt, name string, o lockOptions, sigs <-chan os.Signal, stderr io.Writer, what string) (*client.HandleLease, os.Signal, error) {
	opts := []client.Option{
		client.WithReconnectTimeout(o.reconnect),
		client.WithGrace(o.grace),
		client.WithNotify(func(e client.Event) {
			switch e.Kind {
			case client.DaemonAway:
				fmt.Fprintf(stderr, "leasefs: the daemon of %s does not answer (%v); %s keeps running while lock waits for it\n", mnt, e.Err, what)
			case client.TakenBack:
				fmt.Fprintf(stderr, "leasefs: lease on %s taken back after %v\n", name, e.After.Round(time.Millisecond))
			}
		}),
	}
	if o.noWait || (o.waitSet && o.wait == 0) {
		h, err := client.TryLock(mnt, name, opts...)
		if errors.Is(err, client.ErrHeld) && o.waitSet {
			err = context.DeadlineExceeded
		}
		return h, nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.waitSet {
		wctx, cancel = context.WithTimeout(wctx, o.wait)
		defer cancel()
	}
	var sig os.Signal
	done, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case sig = <-sigs:
			cancel()
		case <-ctx.Done():
			// The context ends on SIGINT or SIGTERM, which sigs hears
			// too: the exit code names the one that came (128 + N).
			select {
			case sig = <-sigs:
			case <-time.After(100 * time.Millisecond):
			}
		case <-done:
		}
	}()
	h, err := client.Lock(wctx, mnt, name, opts...)
	close(done)
	<-watched
	if sig != nil && h != nil {
		_ = h.Unlock()
		h = nil
	}
	return h, sig, err
}

// heldBy names the holder of name under mnt for a message, as
// client.HeldError does: "" when it cannot be read.
func heldBy(mnt, name string) string {
	st, err := client.Stat(mnt, name)
	if err != nil {
		return ""
	}
	return fmt.Sprintf(" by uid %d pid %d on %s since %s", st.HolderUID, st.HolderPID, st.Host, st.StartedAt.UTC().Format(time.RFC3339))
}

// command returns the command of argv with env, wired to this process's
// standard files. If lock itself dies (SIGKILL), its descriptor closes and
// the lease ends: the command gets SIGKILL with it (a parent-death signal).
func command(argv, env []string) *exec.Cmd {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// checkLockName refuses a NAME that is not a lease name under the mount:
// empty, absolute, or with "." or ".." components (docs/PROTOCOL.md §3).
func checkLockName(name string) error {
	if name == "" || strings.HasPrefix(name, "/") {
		return usageError{fmt.Errorf("NAME %q: want a lease name relative to the mount, e.g. ci/deploy", name)}
	}
	for part := range strings.SplitSeq(name, "/") {
		if part == "" || part == "." || part == ".." {
			return usageError{fmt.Errorf("NAME %q: empty, \".\" and \"..\" components are not lease names", name)}
		}
	}
	// The mount would refuse the rest with EINVAL or ENAMETOOLONG
	// (docs/PROTOCOL.md §3): a bad name is the caller's mistake, as above.
	if err := leasecore.ValidateResource(name); err != nil {
		return usageError{fmt.Errorf("NAME %q: %s", name, internalPrefixes.Replace(err.Error()))}
	}
	return nil
}

// checkLeasefsMount refuses a directory that is not the root of a leasefs
// mount, before anything is created in it.
func checkLeasefsMount(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for _, m := range procfs.Mounts() {
		if m.Point == abs && m.FSType == "fuse.leasefs" {
			return nil
		}
	}
	return &userError{msg: abs + " is not a leasefs mount (pass the mountpoint of a running leasefs mount with --mount)"}
}
