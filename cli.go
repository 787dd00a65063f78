package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/mount"
)

// Exit codes of the leasefs command.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	exitHeld  = 3
)

// version is the leasefs release; overridden with -ldflags "-X main.version=…".
var version = "0.1.0-dev"

// usageError marks errors in the command line.
type usageError struct{ error }

// userError is an error described for the user of the command line: msg
// says what failed and what to do. It wraps the error it describes, so that
// errors.Is and errors.As still see sentinel and typed errors.
type userError struct {
	msg string
	err error
}

func (e *userError) Error() string { return e.msg }
func (e *userError) Unwrap() error { return e.err }

// run executes the leasefs command line args and returns the exit code.
// Besides its commands, leasefs answers the mount helper form that
// mount.fuse3 runs, "leasefs STATE MOUNTPOINT -o OPTIONS" (see
// [isMountHelper]).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	if isMountHelper(root, args) {
		return runMountHelper(ctx, args, stderr)
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var code exitCode
	if errors.As(err, &code) {
		return int(code) // the command said all there is to say
	}
	fmt.Fprintln(stderr, "leasefs:", message(err))
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return exitUsage
	case errors.Is(err, daemonlock.ErrHeld):
		return exitHeld
	}
	var fw failedWith
	if errors.As(err, &fw) {
		return fw.code
	}
	return exitError
}

// internalPrefixes strips the package prefixes of the errors of leasefs's
// own packages ("leasecore: open store: …"), which mean nothing to a user,
// where they start the message or one of its wrapped parts (after ": "):
// words such as "leasefs mount: " inside a message are kept.
var internalPrefixes prefixStripper

type prefixStripper struct{}

// Replace returns msg without the package prefixes.
func (prefixStripper) Replace(msg string) string {
	for _, p := range []string{"leasecore: ", "mount: ", "fusefs: ", "daemonlock: "} {
		msg = strings.ReplaceAll(msg, ": "+p, ": ")
		for strings.HasPrefix(msg, p) {
			msg = msg[len(p):]
		}
	}
	return msg
}

// message renders err for the user: a [userError] or a daemon lock held by
// another daemon in words of its own, any other error without the package
// prefixes of leasefs's own packages.
func message(err error) string {
	var ue *userError
	var held *daemonlock.HeldError
	switch {
	case errors.As(err, &ue):
		return ue.msg
	case errors.As(err, &held):
		msg := "state directory " + filepath.Dir(held.Path) + " is held by " + held.Holder.String()
		if errors.Is(err, mount.ErrTakeoverTimeout) {
			return msg + ", which did not hand over within --takeover-timeout"
		}
		return msg + "; stop that daemon first, or take over from it with --takeover"
	}
	return internalPrefixes.Replace(err.Error())
}

// storeError describes err, a failure to open the lease store in state for
// reading.
func storeError(state string, err error) error {
	reason := internalPrefixes.Replace(err.Error())
	var pe *fs.PathError
	if errors.As(err, &pe) {
		// The operation and path of a failure inside the state directory
		// say nothing the user can act on beyond its cause.
		reason = pe.Err.Error()
		if pe.Path != state && pe.Path != filepath.Join(state, leasecore.LeasesDir) {
			reason = pe.Path + ": " + reason
		}
	}
	msg := "cannot read the lease store in " + state + ": " + reason
	if errors.Is(err, fs.ErrPermission) {
		msg += " (run as the owner of the state directory or as root, or pick another with --state)"
	}
	return &userError{msg: msg, err: err}
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "leasefs",
		Short:         "Exclusive writer leases as files: a FUSE lease directory",
		Long:          rootLong,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		// Suggest commands within this edit distance of an unknown one.
		SuggestionsMinimumDistance: 2,
		// An Args validator of its own makes an unknown command a usage
		// error; cobra's default reports it as a plain error.
		Args: func(cmd *cobra.Command, a []string) error {
			if len(a) == 0 {
				return nil
			}
			msg := fmt.Sprintf("unknown command %q", a[0])
			if s := cmd.SuggestionsFor(a[0]); len(s) > 0 {
				msg += " (did you mean " + strings.Join(s, " or ") + "?)"
			}
			return usageError{errors.New(msg)}
		},
		// Without a command, print the help.
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		// An empty directory flag would otherwise mean the working
		// directory (filepath.Abs("")), and an empty --store the default
		// one: nobody means either (an unset variable in a script, say).
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			for _, name := range []string{"state", "mount", "store"} {
				if f := cmd.Flags().Lookup(name); f != nil && f.Changed && f.Value.String() == "" {
					return usageError{fmt.Errorf("--%s is empty: give %s", name, emptyFlagHint[name])}
				}
			}
			return nil
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newMountCmd(stderr), newLsCmd(stdout), newHistoryCmd(stdout), newStatusCmd(stdout),
		newLockCmd(stdout, stderr), newVersionCmd(stdout), newManCmd(stdout))
	root.SetVersionTemplate("leasefs {{.Version}}\n")
	registerDirCompletion(root)
	fixCompletionCmd(root)
	return root
}

// fixCompletionCmd makes an unknown shell ("leasefs completion tcsh") a
// usage error, exit 2: cobra's completion command only has subcommands
// (bash, zsh, fish, powershell), and a command that cannot run answers an
// unknown one with its help and exit 0.
func fixCompletionCmd(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() != "completion" {
			continue
		}
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, a []string) error {
			if len(a) == 0 {
				return cmd.Help()
			}
			var shells []string
			for _, sc := range cmd.Commands() {
				if sc.IsAvailableCommand() {
					shells = append(shells, sc.Name())
				}
			}
			return usageError{fmt.Errorf("unknown shell %q: want one of %s", a[0], strings.Join(shells, ", "))}
		}
	}
}

// emptyFlagHint says what an empty flag of PersistentPreRunE should be.
var emptyFlagHint = map[string]string{"state": "a directory", "mount": "a directory", "store": "file or etcd://HOST:PORT/PREFIX"}

// noArgs refuses positional arguments with a usage error.
func noArgs(cmd *cobra.Command, a []string) error {
	if len(a) > 0 {
		return usageError{fmt.Errorf("unexpected argument %q: %s takes none", a[0], cmd.CommandPath())}
	}
	return nil
}

// optionalArg returns a validator of at most one positional argument, called
// name in its usage error.
func optionalArg(name string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		switch {
		case len(a) > 1:
			return usageError{fmt.Errorf("too many arguments %q: %s takes at most one %s", a, cmd.CommandPath(), name)}
		case len(a) == 1 && a[0] == "":
			return usageError{fmt.Errorf("%s is empty: leave it out to mean all", name)}
		}
		return nil
	}
}

func newMountCmd(stderr io.Writer) *cobra.Command {
	var opts mount.Options
	var sf storeFlags
	var debug bool
	var logFormat string
	var grace time.Duration
	cmd := &cobra.Command{
		Use:   "mount [flags] MOUNTPOINT",
		Short: "Serve the lease store on MOUNTPOINT in the foreground (SIGINT/SIGTERM unmount)",
		Long: `Serve the lease store of --state on MOUNTPOINT, in the foreground, until
SIGINT or SIGTERM (then unmount; handle leases end with the mount). One
daemon serves a state directory at a time: a second mount of the same
state fails at once and names the holder, unless --takeover asks it to
hand over. Root mounts directly; other users through fusermount3.`,
		Example: `  leasefs mount /mnt/leases
  leasefs mount --state /srv/leases --lease-duration 60s --allow-other /mnt/leases
  leasefs mount --takeover /mnt/leases      # replace the running daemon, keep token leases
  leasefs mount --store etcd://etcd1:2379,etcd2:2379/leasefs /mnt/leases   # share leases across machines`,
		Args: func(_ *cobra.Command, a []string) error {
			switch {
			case len(a) == 0:
				return usageError{errors.New("missing MOUNTPOINT")}
			case len(a) > 1:
				return usageError{fmt.Errorf("want one MOUNTPOINT, got %d arguments: %q", len(a), a)}
			case a[0] == "":
				// filepath.Abs("") is the working directory.
				return usageError{errors.New("MOUNTPOINT is empty: give a directory")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, a []string) error {
			switch {
			case opts.LeaseDuration < time.Second:
				return usageError{fmt.Errorf("--lease-duration %s: must be at least 1s", opts.LeaseDuration)}
			case opts.MaxLeasesPerUID < 1:
				return usageError{fmt.Errorf("--max-leases-per-uid %d: must be at least 1", opts.MaxLeasesPerUID)}
			case opts.HistoryKeep < 1:
				return usageError{fmt.Errorf("--history-keep %d: must be at least 1", opts.HistoryKeep)}
			case opts.TakeoverTimeout <= 0:
				return usageError{fmt.Errorf("--takeover-timeout %s: must be positive", opts.TakeoverTimeout)}
			}
			if opts.Pprof && opts.MetricsAddr == "" {
				return usageError{errors.New("--pprof needs --metrics-addr: the profiles are served beside the metrics")}
			}
			if opts.MetricsAddr != "" {
				if _, _, err := net.SplitHostPort(opts.MetricsAddr); err != nil {
					return usageError{fmt.Errorf("--metrics-addr %q: want HOST:PORT, e.g. 127.0.0.1:9623", opts.MetricsAddr)}
				}
			}
			spec, err := sf.parse()
			if err != nil {
				return err
			}
			graceSet := cmd.Flags().Changed("etcd-grace")
			switch {
			case graceSet && spec == nil:
				return usageError{errors.New("--etcd-grace needs an etcd:// --store: the file store's handle leases have no keep-alive")}
			case grace < 0:
				return usageError{fmt.Errorf("--etcd-grace %s: must be 0 (no grace period) or positive", grace)}
			case !graceSet:
				grace = opts.LeaseDuration
			}
			if spec != nil {
				if opts.OpenStore, err = etcdOpener(spec, &sf, &opts, grace); err != nil {
					return err
				}
				opts.StoreName = sf.store
			}
			opts.Mountpoint = a[0]
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			logger, err := newLogger(stderr, logFormat, level)
			if err != nil {
				return err
			}
			opts.Logger = logger
			opts.OnReady = func() { notifyServiceManager(opts.Logger, notifyReady) }
			opts.OnStopping = func() { notifyServiceManager(opts.Logger, notifyStopping) }
			return mount.Run(cmd.Context(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.StateDir, "state", mount.DefaultStateDir(), "state directory of the lease store")
	f.DurationVar(&opts.LeaseDuration, "lease-duration", leasecore.DefaultLeaseDuration, "heartbeat TTL of token leases")
	f.BoolVar(&opts.AllowOther, "allow-other", false, "let other users use the mount (permissions enforced per uid)")
	f.IntVar(&opts.MaxLeasesPerUID, "max-leases-per-uid", leasecore.DefaultMaxLeasesPerUID, "live leases one uid may hold")
	f.IntVar(&opts.HistoryKeep, "history-keep", leasecore.DefaultHistoryKeep, "ended lease records to keep")
	f.DurationVar(&grace, "etcd-grace", 0, "with an etcd store, how long a handle lease whose keep-alive is not confirmed stays in jeopardy before it ends (default the --lease-duration; 0: none)")
	f.BoolVar(&opts.Takeover, "takeover", false, "ask a daemon already serving --state to hand over, then mount")
	f.DurationVar(&opts.TakeoverTimeout, "takeover-timeout", mount.DefaultTakeoverTimeout, "how long --takeover waits for the running daemon")
	f.StringVar(&opts.MetricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://HOST:PORT/metrics (off when empty; port 0 picks a free one)")
	f.BoolVar(&opts.Pprof, "pprof", false, "with --metrics-addr, also serve Go profiles (CPU, heap, block, mutex) at /debug/pprof/")
	f.BoolVar(&debug, "debug", false, "log debug messages")
	f.StringVar(&logFormat, "log-format", "text", "log as text or json (log/slog handlers)")
	f.BoolVar(&opts.Debug, "fuse-debug", false, "log every FUSE request")
	sf.add(f)
	return cmd
}

// newLogger returns the daemon's logger writing to w: log/slog's text
// handler, or its JSON handler for collectors (docs/PROTOCOL.md §8b).
// Errors: a usage error for another format.
func newLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	o := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, usageError{fmt.Errorf("--log-format %q: want text or json", format)}
}

// listingGCPercent is the garbage collector's target of "ls", "history" and
// "status" (runtime/debug.SetGCPercent): they are short-lived and their
// heap is almost all the store they list, which a collection cannot free,
// so fewer collections while it loads are pure gain.
const listingGCPercent = 400

// openReadOnly opens the store at state for reading under its shared lock.
func openReadOnly(state string, stderr io.Writer) (*leasecore.FileStore, error) {
	debug.SetGCPercent(listingGCPercent)
	held, ok := daemonlock.Held(filepath.Join(state, mount.DaemonLockName))
	return leasecore.OpenFileStore(state, leasecore.Options{
		ReadOnly: true,
		NoDaemon: ok && !held,
		// Handle leases of previous daemons still held are shown as such.
		HandleHolders: mount.HandleHolders(state),
		// Records that cannot be loaded are reported on stderr.
		Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
}

// writeJSON prints leases as a JSON array; each lease carries exactly the
// keys of its status document (see [leasecore.Lease.MarshalJSON]).
func writeJSON(w io.Writer, leases []leasecore.Lease) error {
	if leases == nil {
		leases = []leasecore.Lease{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(leases)
}

// flushed flushes out after a listing was written to it without error err,
// and returns the first error of the two. Listings are buffered: a table
// writer writes each cell on its own, which for 100,000 leases would be a
// million write system calls.
func flushed(out *bufio.Writer, err error) error {
	if err != nil {
		return err
	}
	return out.Flush()
}

// tableName renders a resource for a table: as it is, or Go-quoted when it
// holds control characters or spaces, which a name may contain but a
// terminal would obey (escape sequences) or a table would split on.
func tableName(r string) string {
	if !needsQuote(r) {
		return r
	}
	return strconv.Quote(r)
}

// needsQuote reports whether r holds a control character or a space (see
// tableName). Printable ASCII, what almost every name is, is decided a byte
// at a time.
func needsQuote(r string) bool {
	for i := 0; i < len(r); i++ {
		if c := r[i]; c <= ' ' || c >= 0x7f {
			return strings.ContainsFunc(r[i:], func(c rune) bool { return unicode.IsControl(c) || unicode.IsSpace(c) })
		}
	}
	return false
}

// age renders a duration for tables, rounded to seconds, as
// [time.Duration.String] renders it ("-1h2m3s", "45s", "0s").
func age(d time.Duration) string {
	return string(appendAge(nil, d))
}

// appendAge appends age(d) to b without allocating: a listing of 100,000
// leases renders 200,000 of them.
func appendAge(b []byte, d time.Duration) []byte {
	const limit = 1 << 62 // far beyond any lease; rounding cannot overflow below it
	if d <= -limit || d >= limit {
		if d < 0 {
			return append(append(b, '-'), d.Abs().Round(time.Second).String()...)
		}
		return append(b, d.Round(time.Second).String()...)
	}
	if d < 0 {
		b = append(b, '-')
		d = -d
	}
	secs := int64(d.Round(time.Second) / time.Second)
	h, m, sec := secs/3600, secs/60%60, secs%60
	if h > 0 {
		b = append(strconv.AppendInt(b, h, 10), 'h')
	}
	if h > 0 || m > 0 {
		b = append(strconv.AppendInt(b, m, 10), 'm')
	}
	return append(strconv.AppendInt(b, sec, 10), 's')
}

func newVersionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print version and build information",
		Example: "  leasefs version\n  leasefs --version",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(stdout, "leasefs %s\n", version)
			if bi, ok := debug.ReadBuildInfo(); ok {
				fmt.Fprintf(stdout, "go: %s\nmodule: %s\n", bi.GoVersion, bi.Main.Path)
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" || s.Key == "vcs.time" || s.Key == "vcs.modified" {
						fmt.Fprintf(stdout, "%s: %s\n", s.Key, s.Value)
					}
				}
			}
			return nil
		},
	}
}
