package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// docKeys returns the keys of a status document in order.
func docKeys(doc string) []string {
	var keys []string
	for line := range strings.SplitSeq(strings.TrimSpace(doc), "\n") {
		if k, _, ok := strings.Cut(line, " = "); ok {
			keys = append(keys, k)
		}
	}
	return keys
}

// sortedKeys returns the keys of a JSON object, sorted.
func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// `ls --json` carries exactly the keys of the status document, annotations
// and blocked waiters included, and the values agree.
func TestListJSONMatchesStatusDocument(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "busy")
	tok := reserve(t, p)
	mustSh(t, "cat >| \"$P\" <<EOF\ntoken = \"$T\"\nanchor_state = \"s1\"\nanchor_root = \"/r\"\npath = \"a/b\"\nclient = \"c\"\nEOF",
		"P="+p, "T="+tok)
	mustSh(t, "cat >| \"$P\" <<EOF\naction = \"takeover\"\nreason = \"mine now\"\nEOF", "P="+p)
	waiter := startProc(t, nil, "flock", p, "true")
	waitWaiters(t, p, 1)

	st, doc := statusDoc(t, p)
	// The daemon publishes waiter counts for ls just after they change.
	var js map[string]any
	eventually(t, 10*time.Second, "ls --json shows the waiter", func() (bool, string) {
		entries := liveLeases(t, d.state, "busy")
		if len(entries) != 1 {
			return false, fmt.Sprintf("ls --json lists %d leases on busy, want 1", len(entries))
		}
		js = entries[0]
		return fmt.Sprint(js["waiters"]) == "1", fmt.Sprint(js)
	})
	want := slices.Sorted(slices.Values(docKeys(doc)))
	if got := sortedKeys(js); !slices.Equal(got, want) {
		t.Errorf("ls --json keys =\n%v\nstatus document keys =\n%v\n%s", got, want, doc)
	}
	for _, k := range []string{"anchor_state", "anchor_root", "path", "client", "takeover_reason", "lease_id", "boot_id"} {
		if fmt.Sprint(js[k]) != st[k] {
			t.Errorf("ls --json %s = %v, status document %q", k, js[k], st[k])
		}
	}
	if fmt.Sprint(js["waiters"]) != "1" || st["waiters"] != "1" {
		t.Errorf("waiters: ls --json %v, status document %q; want 1", js["waiters"], st["waiters"])
	}
	for _, k := range []string{"started_at", "heartbeat_at", "expires_at", "takeover_requested_at"} {
		jt, err := time.Parse(time.RFC3339Nano, fmt.Sprint(js[k]))
		if err != nil || !jt.Truncate(time.Millisecond).Equal(statusTime(t, st, k)) {
			t.Errorf("ls --json %s = %v (%v), status document %s", k, js[k], err, st[k])
		}
	}
	mustSh(t, "cat >| \"$P\" <<EOF\ntoken = \"$T\"\naction = \"complete\"\nEOF", "P="+p, "T="+tok)
	if r := waiter.wait(10 * time.Second); r.code != 0 {
		t.Errorf("waiter: %s", r)
	}
}

// Annotations written with action = "complete" or "abandon" reach the
// ended record and `history --json`.
func TestAnnotationsOnRelease(t *testing.T) {
	fileStoreOnly(t, "it reads the TOML record files")
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	for _, action := range []string{"complete", "abandon"} {
		p := filepath.Join(d.mountpoint, action)
		tok := reserve(t, p)
		id := parseStatus(t, mustSh(t, `cat "$P"`, "P="+p).stdout)["lease_id"]
		mustSh(t, "cat >| \"$P\" <<EOF\ntoken = \"$T\"\naction = \"$A\"\nanchor_state = \"deadbeef\"\ntask_assignment_id = \"t-9\"\nEOF",
			"P="+p, "T="+tok, "A="+action)
		h := findLease(cliJSON(t, "history", "--state", d.state, action, "--json"), id)
		if h == nil {
			t.Fatalf("%s: lease %s not in history", action, id)
		}
		wantStatus := map[string]string{"complete": "complete", "abandon": "abandoned"}[action]
		if h["status"] != wantStatus || h["anchor_state"] != "deadbeef" || h["task_assignment_id"] != "t-9" {
			t.Errorf("%s: history entry = %v", action, h)
		}
		rec := readRecord(t, d.state, id, func(rec map[string]any) bool { return rec["status"] == wantStatus })
		if rec["anchor_state"] != "deadbeef" || rec["status"] != wantStatus {
			t.Errorf("%s: record = %v", action, rec)
		}
	}
}

// A lease reserved without a pid has no pid in its record: the reference
// store would read pid = 0 as a recorded process.
func TestRecordOmitsUnsetPID(t *testing.T) {
	fileStoreOnly(t, "it reads the TOML record files")
	t.Parallel()
	d := startDaemon(t, daemonOpts{})
	p := filepath.Join(d.mountpoint, "nopid")
	reserve(t, p)
	id := parseStatus(t, mustSh(t, `cat "$P"`, "P="+p).stdout)["lease_id"]
	rec := readRecord(t, d.state, id, nil)
	for _, k := range []string{"pid", "pid_start_ticks", "client", "completed_at", "waiters", "expires_at"} {
		if v, ok := rec[k]; ok {
			t.Errorf("record writes unset %s = %#v", k, v)
		}
	}
}

// readRecord parses the record of lease id in state once it exists and
// satisfies done (any version when done is nil). A serving daemon writes
// record files behind the change, within 100 ms (docs/PROTOCOL.md §4.3);
// the 20 s bound only keeps a record that never comes from hanging the test.
func readRecord(t testing.TB, state, id string, done func(map[string]any) bool) map[string]any {
	t.Helper()
	var m map[string]any
	eventually(t, 20*time.Second, "record "+id+" written", func() (bool, string) {
		data, err := os.ReadFile(filepath.Join(state, "writer-leases", id+".toml"))
		if err != nil {
			return false, err.Error()
		}
		m = map[string]any{}
		if _, err := toml.Decode(string(data), &m); err != nil {
			t.Fatalf("record %s: %v\n%s", id, err, data)
		}
		return done == nil || done(m), string(data)
	})
	return m
}
