package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
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
	Served     bool           `json:"served"`
	State      string         `json:"state"`
	Store      string         `json:"store"`
	PID        int            `json:"pid,omitempty"`
	Host       string         `json:"host,omitempty"`
	Mountpoint string         `json:"mountpoint,omitempty"`
	Since      *time.Time     `json:"since,omitempty"`
	Leases     map[string]int `json:"leases"` // live leases by mode
	Waiters    int            `json:"waiters"`
	// OldestHeartbeat is the least recent heartbeat of a live token lease.
	OldestHeartbeat *time.Time `json:"oldest_heartbeat,omitempty"`
}

// errNotServed makes "leasefs status" exit 1 after printing its report.
var errNotServed = exitCode(exitError)

func newStatusCmd(stdout io.Writer) *cobra.Command {
	var state string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status [--state DIR] [--json]",
		Short: "Tell whether a daemon serves the store, and what it holds",
		Long: `Report whether a leasefs daemon serves the state directory: its pid,
host, mountpoint and start time, the store, the live leases by mode, the
blocked flock waiters and the oldest heartbeat of a token lease. Exit 0
when a daemon serves it, 1 when none does (the report is printed either
way). Reads the store under its lock; works with or without a daemon.`,
		Example: `  leasefs status
  leasefs status --state /srv/leases --json
  leasefs status >/dev/null || leasefs mount /mnt/leases &`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := readDaemonStatus(cmd, state)
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
			if !st.Served {
				return errNotServed
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&state, "state", mount.DefaultStateDir(), "state directory of the lease store")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// readDaemonStatus gathers the status of the store in state.
func readDaemonStatus(cmd *cobra.Command, state string) (daemonStatus, error) {
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
			if !h.StartedAt.IsZero() {
				since := h.StartedAt.UTC()
				st.Since = &since
			}
		}
	}
	s, err := openReadOnly(state, cmd.ErrOrStderr())
	if err != nil {
		return st, err
	}
	defer s.Close()
	leases, err := s.List(cmd.Context())
	if err != nil {
		return st, err
	}
	for _, l := range leases {
		st.Leases[string(l.Mode)]++
		st.Waiters += l.Waiters
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
	fmt.Fprintf(w, "store:       %s %s\n", st.Store, st.State)
	fmt.Fprintf(w, "leases:      %d token, %d handle\n", st.Leases[string(leasecore.ModeToken)], st.Leases[string(leasecore.ModeHandle)])
	fmt.Fprintf(w, "waiters:     %d\n", st.Waiters)
	if st.OldestHeartbeat != nil {
		fmt.Fprintf(w, "oldest heartbeat: %s (%s ago)\n", st.OldestHeartbeat.Format(time.RFC3339), age(time.Since(*st.OldestHeartbeat)))
	}
}

// lockMount returns the mount "leasefs lock" works in: flag, else
// $LEASEFS_MOUNT, else the mountpoint of the daemon serving the default
// state directory.
func lockMount(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if m := os.Getenv("LEASEFS_MOUNT"); m != "" {
		return m, nil
	}
	lockPath := filepath.Join(mount.DefaultStateDir(), mount.DaemonLockName)
	if held, ok := daemonlock.Held(lockPath); ok && held {
		if h, ok := daemonlock.ReadHolder(lockPath); ok && h.Mountpoint != "" {
			return h.Mountpoint, nil
		}
	}
	return "", usageError{errors.New("cannot find the mount: pass --mount DIR or set LEASEFS_MOUNT (no daemon serves " + mount.DefaultStateDir() + ")")}
}
