package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/leasefs/leasefs/internal/daemonlock"
	"github.com/leasefs/leasefs/leasecore"
	"github.com/leasefs/leasefs/mount"
)

// daemonStatus is what "leasefs status" reports (docs/PROTOCOL.md §8); its
// JSON keys are the --json output.
type daemonStatus struct {
	Served   bool   `json:"served"`
	State    string `json:"state"`
	Store    string `json:"store"`               // "file" or "etcd"
	StoreURL string `json:"store_url,omitempty"` // the etcd:// store, as the daemon was given it
	// Cluster is "reachable" or "unreachable" for an etcd store, as seen
	// by this command (not by the daemon); ClusterError says why not.
	Cluster      string     `json:"cluster,omitempty"`
	ClusterError string     `json:"cluster_error,omitempty"`
	PID          int        `json:"pid,omitempty"`
	Host         string     `json:"host,omitempty"`
	Mountpoint   string     `json:"mountpoint,omitempty"`
	Since        *time.Time `json:"since,omitempty"`
	// Leases counts the live leases by mode and Waiters the blocked flock
	// waiters; both are absent when the etcd cluster did not answer
	// (unknown, not zero).
	Leases  map[string]int `json:"leases,omitempty"`
	Waiters *int           `json:"waiters,omitempty"`
	// PreviousHandles counts the handle leases held through a previous
	// daemon's mount whose open file a process still holds
	// (docs/PROTOCOL.md §2, "Handle leases across restarts").
	PreviousHandles int `json:"previous_daemon_handle_leases,omitempty"`
	// OldestHeartbeat is the least recent heartbeat of a live token lease.
	OldestHeartbeat *time.Time `json:"oldest_heartbeat,omitempty"`
	// InJeopardy is, for a daemon serving an etcd store, how many of its
	// handle leases are in jeopardy by its own view (docs/PROTOCOL.md
	// §8a, "Elections and jeopardy"); JeopardySince is when that count
	// last changed. Absent for the file store.
	InJeopardy    *int       `json:"handle_leases_in_jeopardy,omitempty"`
	JeopardySince *time.Time `json:"jeopardy_changed_at,omitempty"`
}

// Exit statuses of "leasefs status", after its report (docs/PROTOCOL.md
// §8, "Exit codes"): no daemon serves the store; a daemon serves it but its
// etcd cluster does not answer this command.
var (
	errNotServed        = exitCode(exitError)
	errClusterUnreached = exitCode(exitUnreachable)
)

func newStatusCmd(stdout io.Writer) *cobra.Command {
	var tf targetFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [--state DIR | --mount DIR] [--store etcd://…] [--json]",
		Short: "Tell whether a daemon serves the store, and what it holds",
		Long: `Report whether a leasefs daemon serves the state directory: its pid,
host, mountpoint and start time, the store, the live leases by mode, the
blocked flock waiters and the oldest heartbeat of a token lease. Reads
the store under its lock; works with or without a daemon. For a daemon
serving an etcd store, it reads the cluster and reports whether it
answers. The report is printed whatever the exit status: 0 when a daemon
serves the store (and its etcd cluster answers), 1 when none serves it, 5
when one does but its etcd cluster does not answer this command within
5 s, so that "leasefs status || alert" catches both.

` + targetHelp,
		Example: `  leasefs status
  leasefs status --mount /mnt/leases
  leasefs status --state /srv/leases --json
  leasefs status >/dev/null || leasefs mount /mnt/leases &
  leasefs status; case $? in 1) echo "no daemon";; 5) echo "etcd cluster unreachable";; esac`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := tf.resolve(cmd)
			if err != nil {
				return err
			}
			st, err := readDaemonStatus(cmd, t.State, &tf.sf)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(st); err != nil {
					return err
				}
			} else {
				printStatus(stdout, st)
			}
			switch {
			case !st.Served:
				return errNotServed
			case st.Cluster == "unreachable":
				return errClusterUnreached
			}
			return nil
		},
	}
	tf.add(cmd.Flags())
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// clusterTimeout bounds how long "leasefs status" waits for an etcd
// cluster before it reports it unreachable (docs/PROTOCOL.md §8: 5 s). A
// variable only so that tests of an unreachable cluster wait less.
var clusterTimeout = 5 * time.Second

// readDaemonStatus gathers the status of the daemon of state and of its
// store: the file store in state, or the etcd store the daemon recorded
// with its lock (or sf names).
func readDaemonStatus(cmd *cobra.Command, state string, sf *storeFlags) (daemonStatus, error) {
	abs, err := filepath.Abs(state)
	if err != nil {
		return daemonStatus{}, err
	}
	st := daemonStatus{State: abs, Store: "file", Leases: map[string]int{string(leasecore.ModeToken): 0, string(leasecore.ModeHandle): 0}}
	lockPath := filepath.Join(abs, mount.DaemonLockName)
	if held, ok := daemonlock.Held(lockPath); ok && held {
		st.Served = true
		if h, ok := daemonlock.ReadHolder(lockPath); ok {
			st.PID, st.Host, st.Mountpoint = h.PID, h.Host, h.Mountpoint
			if sf.store == "" && h.Store != "" {
				sf.store = h.Store
			}
			if !h.StartedAt.IsZero() {
				since := h.StartedAt.UTC()
				st.Since = &since
			}
		}
	}
	var leases []leasecore.Lease
	if sf.store != "" && sf.store != "file" {
		st.Store, st.StoreURL = "etcd", sf.store
		if j, ok := readJeopardy(abs, st.PID); ok && st.Served {
			st.InJeopardy, st.JeopardySince = &j.InJeopardy, &j.At
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), clusterTimeout)
		defer cancel()
		s, err := openForReading(ctx, state, sf, cmd.ErrOrStderr())
		if err == nil {
			leases, err = s.List(ctx)
			s.Close()
		}
		if err != nil {
			var u usageError
			if errors.As(err, &u) {
				return st, err
			}
			st.Cluster, st.ClusterError = "unreachable", err.Error()
			st.Leases = nil // unknown
			return st, nil
		}
		st.Cluster = "reachable"
	} else {
		s, err := openReadOnly(state, cmd.ErrOrStderr())
		if err != nil {
			return st, err
		}
		defer s.Close()
		if leases, err = s.List(cmd.Context()); err != nil {
			return st, err
		}
	}
	waiters := 0
	st.Waiters = &waiters
	for _, l := range leases {
		st.Leases[string(l.Mode)]++
		waiters += l.Waiters
		if l.Daemon == leasecore.DaemonPrevious {
			st.PreviousHandles++
		}
		if l.Mode == leasecore.ModeToken && (st.OldestHeartbeat == nil || l.HeartbeatAt.Before(*st.OldestHeartbeat)) {
			hb := l.HeartbeatAt.UTC()
			st.OldestHeartbeat = &hb
		}
	}
	return st, nil
}

// printStatus writes the status as "key: value" lines.
func printStatus(w io.Writer, st daemonStatus) {
	if st.Served {
		fmt.Fprintf(w, "served:      yes, by pid %d on %s\n", st.PID, st.Host)
		if st.Mountpoint != "" {
			fmt.Fprintf(w, "mountpoint:  %s\n", st.Mountpoint)
		}
		if st.Since != nil {
			fmt.Fprintf(w, "since:       %s (%s ago)\n", st.Since.Format(time.RFC3339), age(time.Since(*st.Since)))
		}
	} else {
		fmt.Fprintln(w, "served:      no daemon serves this store")
	}
	if st.StoreURL != "" {
		fmt.Fprintf(w, "store:       %s (daemon lock in %s)\n", st.StoreURL, st.State)
		if st.InJeopardy != nil {
			fmt.Fprintf(w, "jeopardy:    %d handle leases (the daemon's view, since %s)\n", *st.InJeopardy, st.JeopardySince.Format(time.RFC3339))
		}
		if st.ClusterError != "" {
			fmt.Fprintf(w, "cluster:     unreachable from here: %s\n", st.ClusterError)
			return
		}
		fmt.Fprintln(w, "cluster:     reachable")
	} else {
		fmt.Fprintf(w, "store:       %s %s\n", st.Store, st.State)
	}
	fmt.Fprintf(w, "leases:      %d token, %d handle\n", st.Leases[string(leasecore.ModeToken)], st.Leases[string(leasecore.ModeHandle)])
	if st.Waiters != nil {
		fmt.Fprintf(w, "waiters:     %d\n", *st.Waiters)
	}
	if st.PreviousHandles > 0 {
		fmt.Fprintf(w, "previous daemon: %d handle leases still held through its mount\n", st.PreviousHandles)
	}
	if st.OldestHeartbeat != nil {
		fmt.Fprintf(w, "oldest heartbeat: %s (%s ago)\n", st.OldestHeartbeat.Format(time.RFC3339), age(time.Since(*st.OldestHeartbeat)))
	}
}
