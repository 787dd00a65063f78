// Package retrylog logs a retry loop by the rule of docs/PROTOCOL.md §8b
// ("Logs"): the first failure at WARN or ERROR, each further failure at
// DEBUG, and the recovery at INFO with the number of tries and how long
// they failed. An outage is then two lines at the default level, however
// long it lasts.
package retrylog

import (
	"context"
	"log/slog"
	"time"
)

// Tries follows the failures of one retry loop since its last success. Its
// zero value has seen none. It is not safe for concurrent use: the loop
// that retries owns it.
type Tries struct {
	// Now returns the current time; nil is time.Now.
	Now func() time.Time

	n     int       // failed tries since the last success
	since time.Time // when the first of them failed
}

// Failing reports whether the last try failed.
func (t *Tries) Failing() bool { return t.n > 0 }

// Failed logs err, the failure of a try, as msg with args: at level (WARN or
// ERROR) when it is the first since the last success, else at DEBUG with
// the tries so far.
func (t *Tries) Failed(log *slog.Logger, level slog.Level, msg string, err error, args ...any) {
	t.n++
	if t.n == 1 {
		t.since = t.now()
		log.Log(context.Background(), level, msg, append(args[:len(args):len(args)], "err", err)...)
		return
	}
	log.Debug(msg, append(args[:len(args):len(args)], "tries", t.n, "err", err)...)
}

// Succeeded logs, when tries failed before it, the recovery as msg with
// args at INFO, with the number of tries (the failed ones and this one)
// and how long since the first failure (failed_for); after no failure it
// logs nothing. Either way, t starts over.
func (t *Tries) Succeeded(log *slog.Logger, msg string, args ...any) {
	if t.n == 0 {
		return
	}
	log.Info(msg, append(args[:len(args):len(args)], "tries", t.n+1, "failed_for", t.now().Sub(t.since).Round(time.Millisecond).String())...)
	t.n, t.since = 0, time.Time{}
}

func (t *Tries) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}
