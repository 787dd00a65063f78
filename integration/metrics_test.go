package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Prometheus metrics (docs/PROTOCOL.md §8b): a daemon started with --metrics-addr, driven by
// bash and flock(1) clients, scraped over HTTP.

// servingMetricsRE matches the daemon's "serving metrics" log line and captures the address.
var servingMetricsRE = regexp.MustCompile(`(?m)msg="serving metrics" addr=(\S+) path=(\S+)`)

// metricsURL waits for the daemon's "serving metrics" log line, which follows msg=mounted,
// and returns the URL of its metrics.
func (d *daemon) metricsURL(t testing.TB) string {
	t.Helper()
	var url string
	eventually(t, 10*time.Second, "the daemon logs msg=\"serving metrics\"", func() (bool, string) {
		m := servingMetricsRE.FindStringSubmatch(d.stderr())
		if m == nil {
			return false, d.stderr()
		}
		url = "http://" + m[1] + m[2]
		return true, ""
	})
	return url
}

// scrapeMetrics GETs url and returns its samples by series, e.g.
// `leasefs_live_leases{mode="token"}`, and the body.
func scrapeMetrics(t testing.TB, url string) (map[string]float64, string) {
	t.Helper()
	code, data := httpGet(t, url)
	body := string(data)
	if code != http.StatusOK {
		t.Fatalf("GET %s: status %d\n%s", url, code, body)
	}
	samples := make(map[string]float64)
	for line := range strings.Lines(body) {
		line = strings.TrimSuffix(line, "\n")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("GET %s: malformed sample line %q", url, line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("GET %s: malformed sample line %q", url, line)
		}
		samples[line[:i]] = v
	}
	return samples, body
}

// waitMetrics scrapes url until every series in want has its value (the lease counters follow
// the store's change feed, and a closed descriptor's lease ends a moment after close returns)
// and returns the last scrape.
func waitMetrics(t testing.TB, url, what string, want map[string]float64) map[string]float64 {
	t.Helper()
	var got map[string]float64
	eventually(t, 15*time.Second, what, func() (bool, string) {
		var body string
		got, body = scrapeMetrics(t, url)
		var diff []string
		for series, v := range want {
			if g, ok := got[series]; !ok || g != v {
				diff = append(diff, fmt.Sprintf("%s = %v (present: %v), want %v", series, g, ok, v))
			}
		}
		slices.Sort(diff)
		return len(diff) == 0, strings.Join(diff, "; ") + "\nscrape:\n" + body
	})
	return got
}

// TestMetricsCountClients drives a daemon with --metrics-addr 127.0.0.1:0 through a token
// lease (reserve, two renewals, a refused O_EXCL create, a refused wrong token, rm), a flock(1)
// holder with a refused flock -n and a blocking waiter, and a token lease whose recorded pid
// dies, and checks every counter and gauge by exact count, while and after the clients work.
func TestMetricsCountClients(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	d := startDaemon(t, daemonOpts{metricsAddr: "127.0.0.1:0"})
	url := d.metricsURL(t)
	waitMetrics(t, url, "a fresh daemon's metrics are zero", map[string]float64{
		"leasefs_leases_reserved_total":                 0,
		"leasefs_lease_renewals_total":                  0,
		`leasefs_leases_ended_total{reason="released"}`: 0,
		`leasefs_leases_ended_total{reason="expired"}`:  0,
		`leasefs_live_leases{mode="token"}`:             0,
		`leasefs_live_leases{mode="handle"}`:            0,
		"leasefs_lock_waiters":                          0,
		"leasefs_lock_wait_seconds_count":               0,
		"leasefs_store_commit_duration_seconds_count":   0,
	})

	// A token lease. The O_EXCL create of the held name is refused by the kernel, which knows
	// the name (docs/ARCHITECTURE.md, kernel facts): the daemon never sees it, so it counts
	// no refusal. The wrong token is the daemon's refusal.
	mustSh(t, `set -e
set -C
: > "$M/a"
tok=$(cat "$M/a")
set +C
echo "$tok" >| "$M/a"
echo "$tok" >| "$M/a"
if (set -C; : > "$M/a") 2>/dev/null; then echo "O_EXCL create of a held name succeeded"; exit 7; fi
if echo "hwl_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" >| "$M/a" 2>/dev/null; then echo "a wrong token renewed"; exit 8; fi
rm "$M/a"`, "M="+d.mountpoint)
	waitMetrics(t, url, "after reserve, renew twice, rm", map[string]float64{
		"leasefs_leases_reserved_total":                     1,
		"leasefs_lease_renewals_total":                      2,
		`leasefs_leases_ended_total{reason="released"}`:     1,
		`leasefs_refusals_total{errno="EACCES",op="write"}`: 1,
		`leasefs_live_leases{mode="token"}`:                 0,
		"leasefs_store_commit_duration_seconds_count":       4,
	})

	// A flock(1) holder, a refused flock -n, and a blocking waiter handed the name.
	q := filepath.Join(d.mountpoint, "q")
	holder := startProc(t, nil, "flock", "-n", q, "-c", "echo held; exec sleep 60")
	holder.expect(`(?m)^held$`, holdTimeout)
	if r := sh(t, `flock -n "$P" true`, "P="+q); r.code != 1 {
		t.Fatalf("flock -n on a held name: %s, want exit 1", r)
	}
	waiter := startProc(t, nil, "flock", q, "-c", "echo got")
	waitMetrics(t, url, "while the waiter waits", map[string]float64{
		"leasefs_lock_waiters":                               1,
		`leasefs_live_leases{mode="handle"}`:                 1,
		`leasefs_conflicts_total{errno="EAGAIN",op="flock"}`: 1,
		"leasefs_lock_wait_seconds_count":                    0,
	})
	holder.killGroup()
	holder.wait(10 * time.Second)
	if r := waiter.wait(clientTimeout); r.code != 0 || !strings.Contains(r.stdout, "got") {
		t.Fatalf("blocking flock waiter: %s", r)
	}
	waitMetrics(t, url, "after the handoff", map[string]float64{
		"leasefs_leases_reserved_total":                 3,
		`leasefs_leases_ended_total{reason="released"}`: 3,
		"leasefs_lock_waiters":                          0,
		`leasefs_live_leases{mode="handle"}`:            0,
		"leasefs_lock_wait_seconds_count":               1,
	})

	// A token lease whose recorded pid dies ends by the liveness rule (docs/PROTOCOL.md §5):
	// an expiry, found by the reaper.
	sleeper := startProc(t, nil, "sleep", "600")
	mustSh(t, `set -e
set -C
: > "$P"
tok=$(cat "$P")
cat >| "$P" <<EOF
token = "$tok"
pid = $S
EOF`, "P="+filepath.Join(d.mountpoint, "w"), "S="+strconv.Itoa(sleeper.pid))
	sleeper.killGroup()
	sleeper.wait(10 * time.Second)
	// Store calls that committed a change: a 4 (reserve, 2 renewals, end), q 4 (the
	// holder's reserve, bind, its end — which hands the name to the waiter in the same
	// call — and the waiter's end), w 3 (reserve, renewal, end). The etcd store's waiter
	// takes the name in a transaction of its own once the watch wakes it: one more.
	commits := 11.0
	if etcdPass() {
		commits = 12
	}
	got := waitMetrics(t, url, "after the pid of a lease died", map[string]float64{
		"leasefs_leases_reserved_total":                 4,
		"leasefs_lease_renewals_total":                  3,
		`leasefs_leases_ended_total{reason="released"}`: 3,
		`leasefs_leases_ended_total{reason="expired"}`:  1,
		`leasefs_live_leases{mode="token"}`:             0,
		`leasefs_live_leases{mode="handle"}`:            0,
		"leasefs_lock_waiters":                          0,
		"leasefs_lock_wait_seconds_count":               1,
		"leasefs_store_commit_duration_seconds_count":   commits,
	})

	var refusals []string
	for series := range got {
		if strings.HasPrefix(series, "leasefs_refusals_total{") || strings.HasPrefix(series, "leasefs_conflicts_total{") {
			refusals = append(refusals, series)
		}
	}
	slices.Sort(refusals)
	if want := []string{`leasefs_conflicts_total{errno="EAGAIN",op="flock"}`, `leasefs_refusals_total{errno="EACCES",op="write"}`}; !slices.Equal(refusals, want) {
		t.Errorf("refusal and conflict series %q, want exactly %q", refusals, want)
	}
	for _, series := range []string{"go_goroutines", "process_cpu_seconds_total", "process_open_fds"} {
		if _, ok := got[series]; !ok {
			t.Errorf("the scrape lacks %s of the Go runtime and process collectors", series)
		}
	}
	d.stop(true)
}

// TestMetricsAddrInUse starts a daemon whose --metrics-addr is taken: it fails with exit 1
// and a message naming the address, before mounting anything.
func TestMetricsAddrInUse(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	mp := t.TempDir()
	r := runFailingMount(t, 30*time.Second, mp, "mount", "--state", filepath.Join(t.TempDir(), "state"),
		"--metrics-addr", ln.Addr().String(), mp)
	if r.code != 1 {
		t.Errorf("mount with a taken --metrics-addr: exit %d, want 1; stderr:\n%s", r.code, r.stderr)
	}
	if want := "leasefs: cannot serve metrics on " + ln.Addr().String(); !strings.Contains(r.stderr, want) ||
		!strings.Contains(r.stderr, "address already in use") {
		t.Errorf("stderr does not say %q and why:\n%s", want, r.stderr)
	}
	if n := mountCount(t, mp); n != 0 {
		t.Errorf("a mount that could not serve metrics left %d mounts on %s", n, mp)
	}
}

// httpGet GETs url and returns the status code and body.
func httpGet(t testing.TB, url string) (int, []byte) {
	t.Helper()
	client := http.Client{Timeout: clientTimeout}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, body
}

// TestPprof starts a daemon with --metrics-addr and --pprof, drives lease cycles through bash,
// and reads its profiles (docs/PROTOCOL.md §8b): the goroutine profile names the filesystem's
// event loop (there on any store), the block and mutex profiles are on, and the CPU profile
// is a gzipped profile. A daemon with --metrics-addr alone serves no profiles.
func TestPprof(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonOpts{metricsAddr: "127.0.0.1:0", extraArgs: []string{"--pprof"}})
	base := strings.TrimSuffix(d.metricsURL(t), "/metrics")
	// The two lines are separate writes: the metrics line can be read
	// before the profiles line that follows it.
	eventually(t, 10*time.Second, `the daemon logs msg="serving profiles"`, func() (bool, string) {
		return strings.Contains(d.stderr(), `msg="serving profiles"`), d.stderr()
	})
	mustSh(t, `for i in 1 2 3 4 5; do (set -C; : > "$M/p$i") && rm "$M/p$i"; done`, "M="+d.mountpoint)

	if code, body := httpGet(t, base+"/debug/pprof/goroutine?debug=1"); code != http.StatusOK ||
		!strings.Contains(string(body), "fusefs.(*FS).Run") {
		t.Errorf("goroutine profile: status %d, want 200 naming the filesystem's event loop (fusefs.(*FS).Run):\n%.2000s", code, body)
	}
	for _, p := range []string{"block", "mutex"} {
		if code, body := httpGet(t, base+"/debug/pprof/"+p+"?debug=1"); code != http.StatusOK ||
			!strings.HasPrefix(string(body), "--- ") {
			t.Errorf("%s profile: status %d, want 200 and a profile:\n%.2000s", p, code, body)
		}
	}
	if code, body := httpGet(t, base+"/debug/pprof/profile?seconds=1"); code != http.StatusOK ||
		len(body) < 2 || body[0] != 0x1f || body[1] != 0x8b {
		t.Errorf("CPU profile: status %d, %d bytes, want 200 and a gzipped profile", code, len(body))
	}

	plain := startDaemon(t, daemonOpts{metricsAddr: "127.0.0.1:0"})
	plainBase := strings.TrimSuffix(plain.metricsURL(t), "/metrics")
	if code, _ := httpGet(t, plainBase+"/debug/pprof/goroutine?debug=1"); code != http.StatusNotFound {
		t.Errorf("a daemon without --pprof answered /debug/pprof/goroutine with %d, want 404", code)
	}
	d.stop(true)
	plain.stop(true)
}
