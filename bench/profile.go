package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

// Profiling of the leasefs rows (-profile DIR): the daemon runs with
// --metrics-addr 127.0.0.1:0 --pprof (docs/PROTOCOL.md §8b), each cell of
// rows 1a–1c records a CPU profile of the daemon over its measured window,
// and the end of the leasefs rows records the block and mutex profiles of
// the whole run. The profiler's sampling slows the daemon a little, so the
// numbers of a profiled run are for finding where time goes, not for the
// ratios.

// servingProfilesRE matches the daemon's "serving profiles" log line and
// captures the address.
var servingProfilesRE = regexp.MustCompile(`msg="serving profiles" addr=(\S+)`)

// profileClient fetches profiles from one daemon; the zero value (no
// -profile) fetches nothing. Not safe for concurrent use.
type profileClient struct {
	dir   string // where the profiles go
	base  string // http://ADDR/debug/pprof/
	trace bool   // cells record execution traces instead of CPU profiles
}

// profileArgs returns the daemon flags that serve profiles, none without
// -profile.
func (b *bench) profileArgs() []string {
	if b.cfg.profile == "" {
		return nil
	}
	return []string{"--metrics-addr", "127.0.0.1:0", "--pprof"}
}

// profilerOf waits up to 10 s for d's "serving profiles" line and returns
// a client of its profiles; without -profile it returns the zero client.
// Errors: no such line, or the directory cannot be created.
func (b *bench) profilerOf(d *leasefsDaemon) (profileClient, error) {
	if b.cfg.profile == "" {
		return profileClient{}, nil
	}
	if err := os.MkdirAll(b.cfg.profile, 0o755); err != nil {
		return profileClient{}, err
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if m := servingProfilesRE.FindStringSubmatch(d.log()); m != nil {
			b.logf("profiling the daemon at http://%s/debug/pprof/ into %s", m[1], b.cfg.profile)
			return profileClient{dir: b.cfg.profile, base: "http://" + m[1] + "/debug/pprof/", trace: b.cfg.trace}, nil
		}
		if time.Now().After(deadline) {
			return profileClient{}, fmt.Errorf("the daemon did not log serving profiles:\n%s", d.log())
		}
	}
}

// cell starts a CPU profile of window (whole seconds, at least one) after
// a pause of delay, saved as DIR/name.cpu.pb.gz (with -trace an execution
// trace, DIR/name.trace), and returns a function that waits for it and
// returns its error.
func (p profileClient) cell(name string, delay, window time.Duration) func() error {
	if p.base == "" {
		return func() error { return nil }
	}
	secs := max(1, int((window+time.Second/2)/time.Second))
	done := make(chan error, 1)
	go func() {
		time.Sleep(delay)
		file, path := name+".cpu.pb.gz", "profile"
		if p.trace {
			file, path = name+".trace", "trace"
		}
		done <- p.save(file, path+"?seconds="+strconv.Itoa(secs), time.Duration(secs+30)*time.Second)
	}()
	return func() error { return <-done }
}

// save GETs path (relative to the profiles) into DIR/file, allowing it
// timeout. Errors: the request's, a status other than 200, the write's.
func (p profileClient) save(file, path string, timeout time.Duration) error {
	if p.base == "" {
		return nil
	}
	client := http.Client{Timeout: timeout}
	resp, err := client.Get(p.base + path)
	if err != nil {
		return fmt.Errorf("profile %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile %s: status %s", path, resp.Status)
	}
	f, err := os.Create(filepath.Join(p.dir, file))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("profile %s: %w", path, err)
	}
	return f.Close()
}
