package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasefs/leasefs/internal/refusal"
)

// Expected outcomes are not warnings (docs/PROTOCOL.md §8b, "Logs"): contention is counted,
// misuse is logged.

// TestMetricsConflictsAreNotWarnings: 8 processes polling a held name with `flock -n`, as
// python3-filelock's FileLock does, make the daemon write no warning, and
// leasefs_conflicts_total counts every try; another uid's write to root's lease is still a
// WARN "refused" line, and 60 of them in a burst are cut to the per-uid limit.
func TestMetricsConflictsAreNotWarnings(t *testing.T) {
	t.Parallel()
	requireTool(t, "flock")
	mp := t.TempDir()
	// t.TempDir's per-test parent is 0700; nobody must be able to walk to the mountpoint.
	if err := os.Chmod(filepath.Dir(mp), 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, daemonOpts{mountpoint: mp, allowOther: true, metricsAddr: "127.0.0.1:0"})
	url := d.metricsURL(t)
	q := filepath.Join(d.mountpoint, "q")
	holder := startProc(t, nil, "flock", "-n", q, "-c", "echo held; exec sleep 60")
	holder.expect(`(?m)^held$`, holdTimeout)

	const pollers, tries = 8, 25
	r := mustSh(t, `for i in $(seq "$N"); do
	( n=0
	  for j in $(seq "$TRIES"); do
		if flock -n "$P" true; then echo "poller $i got the held lock"; exit 9; fi
		n=$((n + 1)); sleep 0.05
	  done
	  echo "tries $n" ) &
done
wait`, "P="+q, "N="+strconv.Itoa(pollers), "TRIES="+strconv.Itoa(tries))
	if got := strings.Count(r.stdout, "tries "+strconv.Itoa(tries)+"\n"); got != pollers {
		t.Fatalf("pollers: %q, want %d lines \"tries %d\"", r.stdout, pollers, tries)
	}
	waitMetrics(t, url, "every try counted as a conflict", map[string]float64{
		`leasefs_conflicts_total{errno="EAGAIN",op="flock"}`: pollers * tries,
	})
	samples, _ := scrapeMetrics(t, url)
	for series := range samples {
		if strings.HasPrefix(series, "leasefs_refusals_total{") {
			t.Errorf("the pollers' tries were counted as refusals: %s = %v", series, samples[series])
		}
	}
	if w := regexp.MustCompile(`(?m)^.*level=WARN.*$`).FindAllString(d.stderr(), -1); len(w) > 0 {
		t.Errorf("%d pollers' %d tries each logged warnings:\n%s", pollers, tries, strings.Join(w, "\n"))
	}

	// Misuse by another uid: nobody writes wrong tokens to a lease of its own (the kernel
	// itself refuses its writes to root's lease, mode 0644), which the daemon refuses with
	// EACCES.
	misuse := `
p = os.path.join(M, "nobody-lease")
fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
os.read(fd, 4096)
res = set()
for i in range(int(os.environ["TIMES"])):
    res.add(err(os.write, fd, b"hwl_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n"))
os.close(fd)
os.unlink(p)
out("results", ",".join(sorted(res)))
`
	refusedRE := regexp.MustCompile(`(?m)^.*level=WARN msg=refused op=write resource=nobody-lease pid=\d+ uid=65534 errno=EACCES.*$`)
	kv := pyAsNobody(t, misuse, "M="+d.mountpoint, "TIMES=1")
	wantKV(t, kv, "results", "EACCES")
	if n := len(refusedRE.FindAllString(d.stderr(), -1)); n != 1 {
		t.Errorf("one wrong token written by another uid: %d WARN lines, want 1:\n%s", n, d.stderr())
	}

	start := time.Now()
	kv = pyAsNobody(t, misuse, "M="+d.mountpoint, "TIMES=60")
	elapsed := time.Since(start)
	wantKV(t, kv, "results", "EACCES")
	waitMetrics(t, url, "every wrong token counted", map[string]float64{
		`leasefs_refusals_total{errno="EACCES",op="write"}`: 61,
	})
	// The per-uid limit: the burst, then one line a second (refusal.DefaultPerSecond).
	lines := refusedRE.FindAllString(d.stderr(), -1)
	most := refusal.DefaultBurst + int(elapsed.Seconds()*refusal.DefaultPerSecond) + 1
	if len(lines) < 2 || len(lines) > most {
		t.Errorf("61 wrong tokens by uid 65534 in %v: %d WARN lines, want 2 to %d:\n%s", elapsed, len(lines), most, strings.Join(lines, "\n"))
	}
	holder.killGroup()
	holder.wait(10 * time.Second)
	d.stop(true)
}
