package cli

import (
	"bufio"
	"encoding/json"
	"github.com/leasefs/leasefs/filestore"
	"io"
	"log/slog"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/spf13/cobra"

	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/mount"
)

func newLsCmd(stdout io.Writer) *cobra.Command {
	var tf targetFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls [--state DIR | --mount DIR] [--store etcd://HOST:PORT/PREFIX] [--json]",
		Short: "List live leases: resource, mode, holder, generation, age, expiry",
		Long: `List the live leases of the store: resource, mode, holder uid and pid,
generation (fencing token), age and time to expiry. --json prints every
key of each lease's status document.

` + targetHelp + `

A file store is read under its lock whether or not a daemon serves it;
when none does, ls says so on stderr (a state directory never served is
an empty store), and the exit status is 0.`,
		Example: `  leasefs ls
  leasefs ls --mount /mnt/leases
  leasefs ls --state /srv/leases --json | jq -r '.[] | select(.mode == "handle") | .resource'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := tf.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			out := bufio.NewWriterSize(stdout, 64<<10)
			defer out.Flush()
			if asJSON {
				leases, err := s.List(cmd.Context())
				if err != nil {
					return err
				}
				return flushed(out, writeJSON(out, leases))
			}
			now := time.Now()
			t := newTable(0, "RESOURCE", "MODE", "UID", "PID", "GENERATION", "AGE", "EXPIRES IN").limit(0, nameColumnWidth)
			row := func(l *leasecore.Lease, n int) error {
				t.grow(n)
				t.text(tableName(l.Resource))
				if l.Daemon == leasecore.DaemonPrevious {
					// Held through a previous daemon's mount (docs/PROTOCOL.md §2).
					t.text(string(l.Mode) + " (previous daemon)")
				} else {
					t.text(string(l.Mode))
				}
				t.uint(uint64(l.HolderUID))
				t.int(int64(l.HolderPID))
				t.uint(l.Generation)
				t.age(now.Sub(l.StartedAt))
				if l.ExpiresAt.IsZero() {
					t.text("-")
				} else {
					t.age(l.ExpiresAt.Sub(now))
				}
				return nil
			}
			// The file store lists without copying every lease first.
			if each, ok := s.(leasecore.LiveLister); ok {
				if err := each.EachLive(cmd.Context(), row); err != nil {
					return err
				}
			} else {
				leases, err := s.List(cmd.Context())
				if err != nil {
					return err
				}
				for i := range leases {
					_ = row(&leases[i], len(leases))
				}
			}
			return flushed(out, t.write(out))
		},
	}
	tf.add(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newHistoryCmd(stdout io.Writer) *cobra.Command {
	var tf targetFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "history [--state DIR | --mount DIR] [--store etcd://HOST:PORT/PREFIX] [RESOURCE] [--json]",
		Short: "List ended leases, newest first",
		Long: `List the ended leases kept in the store's history (--history-keep of the
daemon), newest first, of every resource or of RESOURCE: how each ended
(complete or abandoned), its generation and its times.

` + targetHelp + `

A file store is read whether or not a daemon serves it; when none does,
history says so on stderr.`,
		Example: `  leasefs history
  leasefs history --mount /mnt/leases ci/deploy --json`,
		Args: optionalArg("RESOURCE"),
		RunE: func(cmd *cobra.Command, a []string) error {
			resource := ""
			if len(a) == 1 {
				resource = a[0]
			}
			s, err := tf.open(cmd)
			if err != nil {
				return err
			}
			defer s.Close()
			leases, err := s.History(cmd.Context(), resource)
			if err != nil {
				return err
			}
			out := bufio.NewWriterSize(stdout, 64<<10)
			defer out.Flush()
			if asJSON {
				return flushed(out, writeJSON(out, leases))
			}
			t := newTable(len(leases), "RESOURCE", "STATUS", "MODE", "UID", "GENERATION", "STARTED", "ENDED").limit(0, nameColumnWidth)
			for _, l := range leases {
				t.text(tableName(l.Resource))
				t.text(string(l.Status))
				t.text(string(l.Mode))
				t.uint(uint64(l.HolderUID))
				t.uint(l.Generation)
				t.text(l.StartedAt.Format(time.RFC3339))
				t.text(l.CompletedAt.Format(time.RFC3339))
			}
			return flushed(out, t.write(out))
		},
	}
	tf.add(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// listingGCPercent is the garbage collector's target of "ls", "history" and
// "status" (runtime/debug.SetGCPercent): they are short-lived and their
// heap is almost all the store they list, which a collection cannot free,
// so fewer collections while it loads are pure gain.
const listingGCPercent = 400

// openReadOnly opens the store at state for reading under its shared lock.
func openReadOnly(state string, stderr io.Writer) (*filestore.Store, error) {
	debug.SetGCPercent(listingGCPercent)
	held, ok := daemonlock.Held(filepath.Join(state, mount.DaemonLockName))
	return filestore.Open(state, filestore.Options{
		Options: leasecore.Options{
			ReadOnly: true,
			// Handle leases of previous daemons still held are shown as such.
			HandleHolders: mount.HandleHolders(state),
			// Records that cannot be loaded are reported on stderr.
			Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		},
		NoDaemon: ok && !held,
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
