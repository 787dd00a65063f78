package cli

import (
	"log/slog"
	"os"

	"github.com/coreos/go-systemd/v22/daemon"
)

// The states the daemon reports to the service manager.
const (
	notifyReady    = daemon.SdNotifyReady    // the mount answers
	notifyStopping = daemon.SdNotifyStopping // shutdown began
)

// notifyServiceManager sends state ("READY=1", "STOPPING=1") to the service
// manager that $NOTIFY_SOCKET names, as a systemd Type=notify service does
// (docs/PROTOCOL.md §8b); without $NOTIFY_SOCKET it does nothing. A failure
// to send is logged and otherwise ignored: the daemon serves either way, and
// systemd judges a service that never reports ready by its own timeout. A
// failure to send STOPPING=1 is logged at debug level only: the manager
// learns of the stop from the exit anyway, and a daemon started by the mount
// helper form outlives the socket its helper listened on.
func notifyServiceManager(log *slog.Logger, state string) {
	sent, err := daemon.SdNotify(false, state)
	switch {
	case err != nil && state == notifyStopping:
		log.Debug("cannot notify the service manager", "state", state, "socket", os.Getenv("NOTIFY_SOCKET"), "err", err)
	case err != nil:
		log.Warn("cannot notify the service manager", "state", state, "socket", os.Getenv("NOTIFY_SOCKET"), "err", err)
	case sent:
		log.Debug("notified the service manager", "state", state)
	}
}
