package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefs/leasefs/etcdstore/etcdtest"
)

// The integration suite runs against the store that LEASEFS_TEST_STORE
// names (docs/PROTOCOL.md §8a):
//   - "file" (the default): every daemon serves its state directory;
//   - "etcd": one etcd server embedded in the test binary (the client's
//     version, go.etcd.io/etcd/server/v3);
//   - "etcd-server": the separately installed `etcd` binary on PATH
//     (Debian's etcd-server is 3.4), started for the test binary and
//     stopped by its pid after the tests.
//
// In the etcd passes every state directory stands for its own key prefix,
// so that a daemon restarted on the same state finds the same leases and
// two tests never share one. Tests of what only the file store does (the
// files of the state directory, their permissions, the mount helper's
// state= option) say so with [fileStoreOnly]; they run in the file pass.
var testStoreKind = os.Getenv("LEASEFS_TEST_STORE")

// testEtcd is the client address of the etcd pass's server, set by
// [startTestStore] before any test runs; empty in the file pass.
var testEtcd string

// startTestStore starts what testStoreKind needs, with its data under dir;
// the caller runs stop after the tests. Errors: an unknown store kind, or
// an etcd server that does not start.
func startTestStore(dir string) (stop func(), err error) {
	switch testStoreKind {
	case "", "file":
		return func() {}, nil
	case "etcd":
		s, err := etcdtest.StartShared(filepath.Join(dir, "etcd"))
		if err != nil {
			return nil, err
		}
		testEtcd = s.Endpoint()
		return s.Stop, nil
	case "etcd-server":
		return startEtcdServer(filepath.Join(dir, "etcd"))
	}
	return nil, fmt.Errorf("LEASEFS_TEST_STORE=%q: want file, etcd or etcd-server", testStoreKind)
}

// startEtcdServer runs the `etcd` binary on PATH as a single member on
// free loopback ports with its data in dir and waits (at most 30 s) until
// it answers a read. stop SIGTERMs it by its pid and waits for it.
func startEtcdServer(dir string) (stop func(), err error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, fmt.Errorf("LEASEFS_TEST_STORE=etcd-server: %w (apt-get install etcd-server)", err)
	}
	ports, err := freeLoopbackPorts(2)
	if err != nil {
		return nil, err
	}
	client, peer := fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	cmd := exec.Command(bin, "--name", "it", "--data-dir", dir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "it="+peer, "--log-level", "error")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop = func() {
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	}
	endpoint := strings.TrimPrefix(client, "http://")
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		stop()
		return nil, err
	}
	defer cli.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := cli.Status(ctx, endpoint)
		cancel()
		if err == nil {
			fmt.Fprintf(os.Stderr, "integration: etcd %s (%s) serves %s\n", resp.Version, bin, endpoint)
			testEtcd = endpoint
			return stop, nil
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("%s exited before serving: %s", bin, logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("%s does not serve %s after 30s: %v", bin, endpoint, err)
		}
	}
}

// freeLoopbackPorts returns n TCP ports of 127.0.0.1 that were free a
// moment ago.
func freeLoopbackPorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// etcdPass reports whether the suite runs against an etcd store.
func etcdPass() bool { return testEtcd != "" }

// storeArgs returns the --store flag that makes a daemon or CLI command
// use the test store for state directory state: none in the file pass.
func storeArgs(state string) []string {
	if !etcdPass() {
		return nil
	}
	sum := sha256.Sum256([]byte(state))
	return []string{"--store", "etcd://" + testEtcd + "/it-" + hex.EncodeToString(sum[:8])}
}

// withStore adds the test store's --store flag to a leasefs command line
// (argv[i] is the binary, argv[i+1] the subcommand) that names a state
// directory with --state and no store of its own; other command lines are
// returned unchanged.
func withStore(argv []string) []string {
	if !etcdPass() {
		return argv
	}
	i := slices.Index(argv, leasefsBin)
	if i < 0 || i+1 >= len(argv) {
		return argv
	}
	end := slices.Index(argv, "--") // lock's command
	if end < 0 {
		end = len(argv)
	}
	flags := argv[i+2 : end]
	if slices.Contains(flags, "--store") {
		return argv
	}
	j := slices.Index(flags, "--state")
	if j < 0 || j+1 >= len(flags) {
		return argv
	}
	out := slices.Clone(argv[:i+2])
	out = append(out, storeArgs(flags[j+1])...)
	return append(out, argv[i+2:]...)
}

// fileStoreOnly skips t in the etcd pass: what it checks is specific to
// the file store (why), and it runs in the file store's pass.
func fileStoreOnly(t testing.TB, why string) {
	t.Helper()
	if etcdPass() {
		t.Skip("file store only: " + why)
	}
}
