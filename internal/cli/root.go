package cli

import (
	"context"
	"errors"
	"fmt"
	"github.com/leasefs/leasefs/filestore"
	"io"
	"io/fs"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/mount"
)

// Exit codes of the leasefs command.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
	exitHeld  = 3
	// exitUnreachable is the status of "leasefs status" when a daemon
	// serves the store but its etcd cluster does not answer this command
	// (docs/PROTOCOL.md §8, "Exit codes").
	exitUnreachable = 5
)

// version is the leasefs release; overridden with
// -ldflags "-X github.com/leasefs/leasefs/internal/cli.version=…".
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

// Run executes the leasefs command line args (os.Args[1:]: without the
// program name) and returns the process's exit status: 0 success, 1
// failure, 2 usage error, 3 the state directory is served by another
// daemon, 5 "leasefs status" cannot reach the daemon's etcd cluster, and
// those of "leasefs lock" (docs/PROTOCOL.md §8, "Exit codes"). Run returns
// no error: a command's output goes to stdout; its warnings, logs and the
// error it failed with ("leasefs: " and the message) go to stderr.
// Cancelling ctx stops the command ("leasefs mount" unmounts and returns);
// the caller chooses which signals cancel it. Besides its commands, leasefs
// answers the mount helper form that mount.fuse3 runs, "leasefs STATE
// MOUNTPOINT -o OPTIONS" (see [isMountHelper]).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
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
		if pe.Path != state && pe.Path != filepath.Join(state, filestore.LeasesDir) {
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

// rootLong is the root help: the file protocol in five lines
// (docs/PROTOCOL.md §3, §6).
const rootLong = `leasefs mounts exclusive writer leases as files. In a mount m:

  set -C; : > m/name      reserve the lease on "name" (fails if someone holds it)
  cat m/name              first read: the token, once; then the status document
  echo "$tok" >| m/name   renew (heartbeat); a TOML command releases or annotates
  rm m/name               release; ls -l m shows who holds what
  flock m/name cmd        hold the lease exactly as long as cmd runs

The protocol reference is docs/PROTOCOL.md in the leasefs source tree (it
is not installed; the sections that help texts cite, such as §8, are its
sections). "leasefs man" prints this page as leasefs(1); "leasefs man DIR"
writes a page per command. Start with "leasefs mount --help".`

// exitCode is an error that only sets the exit status; nothing is printed.
type exitCode int

func (e exitCode) Error() string { return "exit status " + strconv.Itoa(int(e)) }
