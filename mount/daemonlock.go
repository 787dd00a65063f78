package mount

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/leasefs/leasefs/internal/daemonlock"
)

// acquireDaemonLock takes the state directory's daemon lock. A holder that
// was killed but is stuck in the kernel on its own mount has its connection
// aborted and is waited for. When another daemon holds it and opts.Takeover
// is set, it writes a takeover request and
// retries until the holder lets go or opts.TakeoverTimeout passes.
// Errors: *daemonlock.HeldError naming the holder.
func acquireDaemonLock(ctx context.Context, path, mp string, me daemonlock.Holder, opts Options, log *slog.Logger) (*daemonlock.Lock, error) {
	lock, err := daemonlock.Acquire(path, me)
	var held *daemonlock.HeldError
	if err == nil || !errors.As(err, &held) {
		return lock, err
	}
	if abortDyingHolder(held, mp, log) {
		// The killed holder exits, and its lock goes, once its blocked
		// thread is freed.
		for end := time.Now().Add(dyingWait); time.Now().Before(end); {
			time.Sleep(takeoverPoll)
			if lock, err = daemonlock.Acquire(path, me); err == nil || !errors.Is(err, daemonlock.ErrHeld) {
				return lock, err
			}
		}
	}
	if !opts.Takeover {
		return nil, err
	}
	timeout := opts.TakeoverTimeout
	if timeout <= 0 {
		timeout = DefaultTakeoverTimeout
	}
	log.Info("asking the running daemon to hand over", "holder", held.Holder.String(), "timeout", timeout.String())
	if werr := daemonlock.WriteTakeoverRequest(path, daemonlock.TakeoverRequest{Requester: me}); werr != nil {
		return nil, werr
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(takeoverPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = daemonlock.ClearTakeoverRequest(path)
			return nil, ctx.Err()
		case <-deadline.C:
			_ = daemonlock.ClearTakeoverRequest(path)
			return nil, fmt.Errorf("%w after %s: %w", ErrTakeoverTimeout, timeout, err)
		case <-tick.C:
		}
		if lock, err = daemonlock.Acquire(path, me); err == nil || !errors.Is(err, daemonlock.ErrHeld) {
			return lock, err
		}
	}
}

// watchTakeover polls for a takeover request on the daemon lock at path and
// delivers the first one.
func watchTakeover(ctx context.Context, path string) <-chan daemonlock.TakeoverRequest {
	ch := make(chan daemonlock.TakeoverRequest, 1)
	go func() {
		tick := time.NewTicker(takeoverPoll)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if req, ok := daemonlock.ReadTakeoverRequest(path); ok {
				ch <- req
				return
			}
		}
	}()
	return ch
}
