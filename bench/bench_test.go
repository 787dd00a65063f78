package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/internal/testenv"
)

// TestMain lets the test binary play the helper roles the command
// re-executes itself for (the in-memory FUSE server, the flock holder).
func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// TestQuickSmoke runs the command with -quick and -profile on its cheapest
// rows (the leasefs lease cycle and the kill-to-grant row through a real
// mount, the in-process store, the in-memory and durable FUSE ceilings, the
// fsync floors)
// and checks that the table has every row with non-zero numbers and that the
// report files and the daemon's profiles are written. It asserts no timing.
func TestQuickSmoke(t *testing.T) {
	testenv.RequireFUSE(t)
	before := benchMounts()
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	prof := t.TempDir()
	err := run(ctx, []string{"-quick", "-only", `^(1a|2|3a|3b|3c|3d|3e|3f|3g|4r|4f|8)$`, "-out", out, "-profile", prof}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	if left := benchMounts() - before; left > 0 {
		t.Errorf("%d mounts of the run are left in /proc/self/mountinfo", left)
	}
	table := stdout.String()
	for _, id := range []string{"1a", "2", "3a", "3b", "3c", "3d", "3e", "3f", "3g", "4r", "4f"} {
		for _, n := range clientCounts {
			re := regexp.MustCompile(`(?m)^` + id + `\s+.*?\s+` + strconv.Itoa(n) + `\s+(\d+)\s+(\S+)\s+(\S+)`)
			m := re.FindStringSubmatch(table)
			if m == nil {
				t.Errorf("no row %s with %d clients in the table:\n%s", id, n, table)
				continue
			}
			if m[1] == "0" || m[2] == "-" || m[3] == "-" {
				t.Errorf("row %s, %d clients: ops/s %s p50 %s p99 %s, want non-zero numbers", id, n, m[1], m[2], m[3])
			}
		}
	}
	if !regexp.MustCompile(`(?m)^8\s+.*\s+-\s+-\s+\d\S*s\s+\d\S*s\s`).MatchString(table) {
		t.Errorf("no kill-to-grant row 8 with latencies in the table:\n%s", table)
	}
	if !strings.Contains(table, "Targets") {
		t.Errorf("no targets under the table:\n%s", table)
	}
	md, err := os.ReadFile(filepath.Join(out, "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Machine", "| CPU |", "| kernel |", "| temp dir filesystem |", "| Go |", "| 1a |", "throughput.svg"} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("BENCHMARKS.md lacks %q", want)
		}
	}
	svg, err := os.ReadFile(filepath.Join(out, "bench", "throughput.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("<polyline")) {
		t.Errorf("throughput.svg has no chart line:\n%.400s", svg)
	}
	// -profile: a gzipped profile per 1a cell, and the block and mutex
	// profiles of the leasefs rows.
	names := []string{"leasefs.block.pb.gz", "leasefs.mutex.pb.gz"}
	for _, n := range clientCounts {
		names = append(names, fmt.Sprintf("1a-%dclients.cpu.pb.gz", n))
	}
	for _, name := range names {
		data, err := os.ReadFile(filepath.Join(prof, name))
		if err != nil || len(data) < 2 || data[0] != 0x1f || data[1] != 0x8b {
			t.Errorf("-profile: %s is not a gzipped profile (%d bytes, %v)", name, len(data), err)
		}
	}
}

// benchMounts counts the mounts inside temporary directories of the command.
func benchMounts() int {
	n := 0
	for _, m := range procfs.Mounts() {
		if strings.Contains(m.Point, "/leasefs-bench-") {
			n++
		}
	}
	return n
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestTraceCells runs the 1a row with -profile and -trace and checks that
// each cell left an execution trace of the daemon (a file that begins with
// the Go trace header) and no CPU profile; -trace without -profile is
// refused. It asserts no timing.
func TestTraceCells(t *testing.T) {
	if _, err := parseFlags([]string{"-trace"}, &bytes.Buffer{}); err == nil {
		t.Error("-trace without -profile was accepted")
	}
	testenv.RequireFUSE(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, prof := t.TempDir(), t.TempDir()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, []string{"-quick", "-only", `^1a$`, "-out", out, "-profile", prof, "-trace"}, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	for _, n := range clientCounts {
		name := fmt.Sprintf("1a-%dclients", n)
		data, err := os.ReadFile(filepath.Join(prof, name+".trace"))
		if err != nil || !bytes.HasPrefix(data, []byte("go 1.")) {
			t.Errorf("-trace: %s.trace is not an execution trace (%.16q, %v)", name, data, err)
		}
		if fileExists(filepath.Join(prof, name+".cpu.pb.gz")) {
			t.Errorf("-trace: %s.cpu.pb.gz was written as well", name)
		}
	}
}

// A partial or quick run without -out writes no BENCHMARKS.md (the
// repository's is a full run's); a full run defaults to the module root.
func TestPartialRunWritesNoReport(t *testing.T) {
	for _, args := range [][]string{{"-only", "^1a$"}, {"-quick"}, {"-clients", "1"}} {
		cfg, err := parseFlags(args, &bytes.Buffer{})
		if err != nil || cfg.out != "" {
			t.Errorf("parseFlags(%q): out %q, %v; want no output directory", args, cfg.out, err)
		}
	}
	cfg, err := parseFlags(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cfg.out, "go.mod")); err != nil {
		t.Errorf("full run: out %q is not the module root: %v", cfg.out, err)
	}
	if !slices.Equal(cfg.clients, clientCounts) {
		t.Errorf("full run: clients %v, want %v", cfg.clients, clientCounts)
	}
}

// -clients takes distinct counts from 1 to 1024.
func TestParseClients(t *testing.T) {
	for _, tc := range []struct {
		list string
		want []int
	}{
		{"1", []int{1}},
		{"16, 1", []int{16, 1}},
		{"1,4,16,64", []int{1, 4, 16, 64}},
		{"", nil},
		{"0", nil},
		{"1025", nil},
		{"1,1", nil},
		{"x", nil},
		{"1,", nil},
	} {
		got, err := parseClients(tc.list)
		if !slices.Equal(got, tc.want) || (err == nil) != (tc.want != nil) {
			t.Errorf("parseClients(%q) = %v, %v; want %v", tc.list, got, err, tc.want)
		}
	}
}

// A grant is out of turn when a wait begun at least the tolerance earlier
// was still waiting when it was granted.
func TestOutOfTurn(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	rec := func(asked, granted float64) grantRec { return grantRec{asked: at(asked), granted: at(granted)} }
	for _, tc := range []struct {
		name string
		recs []grantRec
		tol  time.Duration
		want int
		lead time.Duration
	}{
		{"in order", []grantRec{rec(0, 1), rec(2, 3), rec(4, 5)}, time.Millisecond, 0, 0},
		{"second passes the first", []grantRec{rec(0, 10), rec(2, 5)}, time.Millisecond, 1, 2 * time.Millisecond},
		{"within the tolerance", []grantRec{rec(0, 10), rec(0.5, 5)}, time.Millisecond, 0, 0},
		{"within the tolerance, none allowed", []grantRec{rec(0, 10), rec(0.5, 5)}, 0, 1, time.Millisecond / 2},
		{"two pass one", []grantRec{rec(0, 20), rec(2, 5), rec(3, 8)}, time.Millisecond, 2, 3 * time.Millisecond},
		{"the earlier was granted first", []grantRec{rec(0, 4), rec(2, 5)}, time.Millisecond, 0, 0},
		{"passes two", []grantRec{rec(0, 20), rec(1, 21), rec(6, 5)}, time.Millisecond, 1, 6 * time.Millisecond},
	} {
		if got, lead := outOfTurn(tc.recs, tc.recs, tc.tol); got != tc.want || lead != tc.lead {
			t.Errorf("%s: outOfTurn = %d, %v; want %d, %v", tc.name, got, lead, tc.want, tc.lead)
		}
	}
}
