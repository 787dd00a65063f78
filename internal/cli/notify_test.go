package cli

import (
	"bytes"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// listenNotify listens on a unixgram socket named name, as a service manager
// does on $NOTIFY_SOCKET; the socket is closed at the end of the test.
func listenNotify(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatalf("listen on %s: %v", name, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// readNotify returns the next datagram on conn, failing the test after 5 s.
func readNotify(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 4096)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("read the notify socket: %v", err)
	}
	return string(buf[:n])
}

// notifyServiceManager sends each state as one datagram to the socket that
// $NOTIFY_SOCKET names, a path or (with a leading '@') an abstract socket.
func TestNotifyServiceManager(t *testing.T) {
	for _, tc := range []struct{ name, socket string }{
		{"path", filepath.Join(t.TempDir(), "notify")},
		{"abstract", "@leasefs-notify-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := listenNotify(t, tc.socket)
			t.Setenv("NOTIFY_SOCKET", tc.socket)
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			notifyServiceManager(log, notifyReady)
			notifyServiceManager(log, notifyStopping)
			if got := readNotify(t, conn); got != "READY=1" {
				t.Errorf("first datagram %q, want READY=1", got)
			}
			if got := readNotify(t, conn); got != "STOPPING=1" {
				t.Errorf("second datagram %q, want STOPPING=1", got)
			}
			if logs.Len() > 0 {
				t.Errorf("unexpected log output:\n%s", logs.String())
			}
		})
	}
}

// Without $NOTIFY_SOCKET nothing is sent or logged; a socket nobody listens
// on is a warning, not a failure.
func TestNotifyServiceManagerNoSocket(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	t.Setenv("NOTIFY_SOCKET", "")
	notifyServiceManager(log, notifyReady)
	if logs.Len() > 0 {
		t.Errorf("without NOTIFY_SOCKET: unexpected log output:\n%s", logs.String())
	}
	missing := filepath.Join(t.TempDir(), "nobody")
	t.Setenv("NOTIFY_SOCKET", missing)
	notifyServiceManager(log, notifyReady)
	if out := logs.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, missing) {
		t.Errorf("a socket nobody listens on: log %q, want a warning naming it", out)
	}
}
