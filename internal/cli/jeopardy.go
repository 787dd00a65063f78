package cli

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/google/renameio/v2"
)

// jeopardyName is the file in the state directory where a daemon serving
// an etcd store records how many of its handle leases are in jeopardy
// (docs/PROTOCOL.md §8, §8a "Elections and jeopardy"): the daemon's own
// view, which "leasefs status" shows beside what it reads from the
// cluster.
const jeopardyName = "etcd-jeopardy.json"

// jeopardyRecord is the content of [jeopardyName].
type jeopardyRecord struct {
	// PID is the daemon that wrote it: a record of another pid is stale.
	PID int `json:"pid"`
	// InJeopardy is the number of the daemon's handle leases in jeopardy.
	InJeopardy int `json:"handle_leases_in_jeopardy"`
	// At is when the count last changed.
	At time.Time `json:"at"`
}

// writeJeopardy records n handle leases in jeopardy for the daemon of
// state (this process), atomically (renameio). A failure is logged: the
// count is for display only.
func writeJeopardy(log *slog.Logger, state string, n int) {
	b, _ := json.Marshal(jeopardyRecord{PID: os.Getpid(), InJeopardy: n, At: time.Now().UTC()})
	if err := renameio.WriteFile(filepath.Join(state, jeopardyName), append(b, '\n'), 0o644); err != nil {
		log.Warn("recording the handle leases in jeopardy for leasefs status failed", "state", state, "err", err)
	}
}

// readJeopardy returns the count of handle leases in jeopardy that daemon
// pid recorded in state, and whether it recorded one.
func readJeopardy(state string, pid int) (jeopardyRecord, bool) {
	b, err := os.ReadFile(filepath.Join(state, jeopardyName))
	if err != nil {
		return jeopardyRecord{}, false
	}
	var r jeopardyRecord
	if json.Unmarshal(b, &r) != nil || r.PID != pid || pid == 0 {
		return jeopardyRecord{}, false
	}
	return r, true
}
