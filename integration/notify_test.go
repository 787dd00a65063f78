package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/leasefs/leasefs/internal/procfs"
	"github.com/leasefs/leasefs/internal/testenv"
)

// notifyMsg is one datagram a daemon sent to a test's notify socket, with
// what the test saw of the mountpoint the moment it arrived.
type notifyMsg struct {
	state   string
	fuse    bool  // statfs of the mountpoint reports a FUSE filesystem
	mounted bool  // /proc/self/mountinfo has a fuse.leasefs mount on the mountpoint
	listErr error // listing the mountpoint
}

// listenNotify listens on a unixgram socket named socket (a path, or an
// abstract name starting with '@'), as systemd does on $NOTIFY_SOCKET. Each
// datagram is delivered on the channel once the mountpoint mp has been
// examined. The socket is closed at the end of the test.
func listenNotify(t *testing.T, socket, mp string) <-chan notifyMsg {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		t.Fatalf("listen on %s: %v", socket, err)
	}
	msgs := make(chan notifyMsg, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return // closed by cleanup
			}
			m := notifyMsg{state: string(buf[:n])}
			var st unix.Statfs_t
			m.fuse = unix.Statfs(mp, &st) == nil && st.Type == unix.FUSE_SUPER_MAGIC
			for _, e := range procfs.Mounts() {
				m.mounted = m.mounted || (e.Point == mp && e.FSType == "fuse.leasefs")
			}
			_, m.listErr = os.ReadDir(mp)
			msgs <- m
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	return msgs
}

// nextNotify returns the next datagram, failing the test after timeout.
func nextNotify(t *testing.T, msgs <-chan notifyMsg, timeout time.Duration) notifyMsg {
	t.Helper()
	select {
	case m := <-msgs:
		return m
	case <-time.After(timeout):
		t.Fatalf("no notification within %s", timeout)
		return notifyMsg{}
	}
}

// With $NOTIFY_SOCKET set, as systemd sets it for a Type=notify service,
// the daemon sends READY=1 once the mount answers (not before: the test
// looks at the mountpoint the moment the datagram arrives) and STOPPING=1
// when shutdown begins, on SIGTERM and on an unmount from outside
// (docs/PROTOCOL.md §8b).
func TestNotifyReadyStopping(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		abstract bool // an abstract socket name, "@…"
		umount   bool // stop by unmounting from outside instead of SIGTERM
	}{
		{name: "path-sigterm"},
		{name: "abstract-sigterm", abstract: true},
		{name: "path-umount", umount: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testenv.RequireFUSE(t)
			mp := t.TempDir()
			if real, err := filepath.EvalSymlinks(mp); err == nil {
				mp = real
			}
			socket := filepath.Join(t.TempDir(), "notify")
			if tc.abstract {
				socket = fmt.Sprintf("@leasefs-test-%d-%s", os.Getpid(), tc.name)
			}
			msgs := listenNotify(t, socket, mp)
			d := startDaemon(t, daemonOpts{mountpoint: mp, env: []string{"NOTIFY_SOCKET=" + socket}})

			ready := nextNotify(t, msgs, 10*time.Second)
			if ready.state != "READY=1" {
				t.Fatalf("first notification %q, want READY=1; stderr:\n%s", ready.state, d.stderr())
			}
			if !ready.fuse || !ready.mounted || ready.listErr != nil {
				t.Errorf("when READY=1 arrived: statfs FUSE %v, in mountinfo %v, listing error %v; want a mount that answers",
					ready.fuse, ready.mounted, ready.listErr)
			}
			// The mount keeps answering, and nothing else is sent while it serves.
			mustSh(t, ": > "+filepath.Join(mp, "job")+" && cat "+filepath.Join(mp, "job")+" >/dev/null")
			select {
			case m := <-msgs:
				t.Errorf("notification %q while serving, want none before shutdown", m.state)
			case <-time.After(200 * time.Millisecond):
			}

			if tc.umount {
				if err := unix.Unmount(mp, 0); err != nil {
					t.Fatalf("umount %s: %v", mp, err)
				}
			} else if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatalf("SIGTERM: %v", err)
			}
			if m := nextNotify(t, msgs, 10*time.Second); m.state != "STOPPING=1" {
				t.Errorf("notification after shutdown began %q, want STOPPING=1", m.state)
			}
			code, ok := d.waitExit(10 * time.Second)
			if !ok || code != 0 {
				t.Errorf("daemon exit code %d (exited: %v), want 0; stderr:\n%s", code, ok, d.stderr())
			}
			select {
			case m := <-msgs:
				t.Errorf("extra notification %q after STOPPING=1", m.state)
			case <-time.After(100 * time.Millisecond):
			}
		})
	}
}
