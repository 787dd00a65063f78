package retrylog

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestTries fails a loop three times, then succeeds, twice over: each
// outage is one ERROR line and one INFO line at the default level, and the
// further failures are DEBUG lines.
func TestTries(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		Level:       slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr { return dropTime(a) },
	}))
	now := time.Unix(1000, 0)
	tr := Tries{Now: func() time.Time { return now }}
	tr.Succeeded(log, "recovered", "lease", "l1") // no failure: nothing
	for range 2 {
		for range 3 {
			tr.Failed(log, slog.LevelError, "ending failed; retrying", errors.New("disk full"), "lease", "l1")
			now = now.Add(time.Second)
		}
		if !tr.Failing() {
			t.Errorf("Failing() = false after failures")
		}
		tr.Succeeded(log, "recovered", "lease", "l1")
		if tr.Failing() {
			t.Errorf("Failing() = true after a success")
		}
	}
	outage := `level=ERROR msg="ending failed; retrying" lease=l1 err="disk full"
level=DEBUG msg="ending failed; retrying" lease=l1 tries=2 err="disk full"
level=DEBUG msg="ending failed; retrying" lease=l1 tries=3 err="disk full"
level=INFO msg=recovered lease=l1 tries=4 failed_for=3s
`
	if got := buf.String(); got != strings.Repeat(outage, 2) {
		t.Errorf("log:\n%s\nwant twice:\n%s", got, outage)
	}
}

func dropTime(a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}
