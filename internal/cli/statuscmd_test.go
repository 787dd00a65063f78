package cli

import (
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"
)

// closedEndpoint returns a loopback HOST:PORT on which nothing listens: a
// port the kernel gave and took back.
func closedEndpoint(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestStatusExitCodes checks the exit statuses of docs/PROTOCOL.md §8, "Exit codes": 0 for a
// served file store, 1 for a store no daemon serves, 5 for a daemon whose etcd cluster does
// not answer; the report is printed in each case.
func TestStatusExitCodes(t *testing.T) {
	t.Setenv("LEASEFS_STATE", "")
	t.Setenv("LEASEFS_MOUNT", "")
	// A closed port refuses at once: the report, not the wait, is tested.
	defer func(d time.Duration) { clusterTimeout = d }(clusterTimeout)
	clusterTimeout = time.Second
	file := serveState(t, "/mnt/file", "")
	etcd := serveState(t, "/mnt/etcd", "etcd://"+closedEndpoint(t)+"/leasefs")
	cases := []struct {
		name, state string
		code        int
		want        string
	}{
		{"served file store", file, exitOK, "served:      yes"},
		{"no daemon", t.TempDir(), exitError, "served:      no daemon serves this store"},
		{"etcd cluster unreachable", etcd, exitUnreachable, "cluster:     unreachable from here: "},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, "status", "--state", c.state)
			if r.code != c.code || !strings.Contains(r.stdout, c.want) {
				t.Errorf("leasefs status --state %s: %+v\nwant exit %d and %q", c.state, r, c.code, c.want)
			}
		})
	}
	r := runCLI(t, "status", "--state", etcd, "--json")
	var st daemonStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || r.code != exitUnreachable || !st.Served || st.Cluster != "unreachable" {
		t.Errorf("leasefs status --json of an unreachable cluster: %v, %+v; want exit %d, served, cluster unreachable", err, r, exitUnreachable)
	}
	if strings.Contains(r.stdout, `"leases"`) || strings.Contains(r.stdout, `"waiters"`) {
		t.Errorf("leasefs status --json of an unreachable cluster counts leases or waiters it could not read:\n%s", r.stdout)
	}
}
