package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/mount"
	"github.com/spf13/cobra"
)

func newMountCmd(stderr io.Writer) *cobra.Command {
	var opts mount.Options
	var sf storeFlags
	var debug bool
	var logFormat, logLevel string
	var grace time.Duration
	cmd := &cobra.Command{
		Use:   "mount [flags] MOUNTPOINT",
		Short: "Serve the lease store on MOUNTPOINT in the foreground (SIGINT/SIGTERM unmount)",
		Long: `Serve the lease store of --state on MOUNTPOINT, in the foreground, until
SIGINT or SIGTERM (then unmount and exit 0). Leases outlive the daemon:
token leases keep their recorded heartbeat, and a handle lease lives on
while a process still holds the open file it was locked on; the next
daemon of the state directory keeps it, and ends it when the last such
descriptor closes (docs/PROTOCOL.md §2 in the source tree, "Handle
leases across restarts"). One daemon serves a state directory at a time:
a second mount of the same state fails at once and names the holder,
unless --takeover asks it to hand over. Root mounts directly; other users
through fusermount3.`,
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
			level, err := parseLogLevel(logLevel)
			if err != nil {
				return err
			}
			if debug {
				if cmd.Flags().Changed("log-level") && level != slog.LevelDebug {
					return usageError{fmt.Errorf("--debug is --log-level debug; it contradicts --log-level %s", logLevel)}
				}
				level = slog.LevelDebug
			}
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
			if opts.OpenStore, err = storeOpener(spec, &sf, &opts, grace); err != nil {
				return err
			}
			opts.Mountpoint = a[0]
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
	f.StringVar(&logLevel, "log-level", "info", "log messages of this level and above: debug (every lease's grant and end), info, warn or error")
	f.BoolVar(&debug, "debug", false, "log debug messages: the same as --log-level debug")
	f.StringVar(&logFormat, "log-format", "text", "log as text or json (log/slog handlers)")
	f.BoolVar(&opts.Debug, "fuse-debug", false, "log every FUSE request")
	sf.add(f)
	return cmd
}

// logLevels are the values of --log-level (docs/PROTOCOL.md §8b, "Logs").
var logLevels = map[string]slog.Level{
	"debug": slog.LevelDebug,
	"info":  slog.LevelInfo,
	"warn":  slog.LevelWarn,
	"error": slog.LevelError,
}

// parseLogLevel returns the level that --log-level name sets. Errors: a
// usage error for another name.
func parseLogLevel(name string) (slog.Level, error) {
	if l, ok := logLevels[strings.ToLower(name)]; ok {
		return l, nil
	}
	return 0, usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", name)}
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
